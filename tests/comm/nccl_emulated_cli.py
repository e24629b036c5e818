#!/usr/bin/env python3
"""The ringattn program built with -DRINGATTN_CUDA_EMULATION=ON: the CUDA backend's and the NCCL
communicator's own code on the CPU emulation of CUDA and NCCL.

  attention   forward and backward checked against fp64 (--check, exit 0) for causal/zigzag,
              window, documents and BigBird masks, both schedules, an uneven length, P = 1..4,
              fp32 and bf16, over --comm nccl; the hybrid (--ulysses 2: the group's NCCL
              communicator by ncclCommSplit, its all-to-all on the device) at P = 2 and 4, the
              latter also with ranks placed round-robin on two pretend nodes; over --comm mpi
              (host-staged) with 2 ranks sharing one emulated GPU, the hybrid included; and
              `ringattn bench` (a context per point) with --ulysses 1,2 over NCCL and host-staged
  layer       the LoRA layer at P = 2 on --backend cuda --comm nccl (cuBLAS GEMMs served by the CPU
              GEMM, RoPE/bias kernels on the emulated GPU, NCCL parameter gathers and gradient
              reduce-scatter): --check against the CPU backend in fp32 (Y, dX, the LoRA gradients)
              with RoPE and biases, fp32 and bf16; training with --steps gives the CPU's losses
              and output; the host-staged --comm mpi path; the demo
  faults      a rank stopped (SIGSTOP) mid-backward: exit 4 within the timeout, the error names
              the rank and the step, and teardown does not hang; more ranks than GPUs on a node
              with --comm nccl: a usage error naming both counts

Sizes are tiny: emulated kernels run threads as fibers on one core.
"""
import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cli"))
from cli_test import load, save, uniform  # noqa: E402  (.npy files without NumPy)

SMALL = ["--heads", "2", "--head-dim", "16", "--check"]


def run(args, np, env=None, limit=120.0):
    cmd = [ARGS.mpiexec, "--oversubscribe", "--bind-to", "none", "-np", str(np), ARGS.ringattn] + args
    full_env = dict(os.environ, **(env or {}))
    full_env.setdefault("OMPI_MCA_btl_vader_single_copy_mechanism", "none")
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            errors="replace", start_new_session=True)
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return None, out, err + "\n(killed after %.0f s)" % limit, time.monotonic() - t0
    return proc.returncode, out, err, time.monotonic() - t0


def attention_cases():
    nccl = ["--backend", "cuda", "--comm", "nccl", "--backward"]
    masks = {
        "causal/zigzag": ["--causal", "--layout", "zigzag"],
        "window": ["--window", "24,8", "--layout", "contiguous"],
        "documents": ["--doc-lens", "50,30,57", "--causal"],
        "bigbird": ["--bigbird", "1,1,1", "--mask-block", "16", "--seed", "5"],
    }
    cases = []
    for np in (1, 2, 3, 4):
        for i, (name, mask) in enumerate(masks.items()):
            if np == 1 and i > 0:
                continue  # one rank moves nothing: one mask is enough
            schedule = ["direct", "ring"][(np + i) % 2]
            dtype = ["fp32", "bf16"][(np + i // 2) % 2]
            args = nccl + mask + SMALL + ["--seq-len", "137", "--schedule", schedule, "--dtype", dtype]
            cases.append(("P=%d %s %s %s L=137" % (np, name, schedule, dtype), np, args, {}))
    # The hybrid: --ulysses 2 over NCCL (4 heads, so that 2 divides the heads and the K/V heads).
    hybrid = nccl + ["--ulysses", "2", "--heads", "4", "--kv-heads", "2", "--head-dim", "16", "--check"]
    cases.append(("P=2 --ulysses 2 causal/zigzag direct fp32 L=137", 2,
                  hybrid + masks["causal/zigzag"] + ["--seq-len", "137"], {}))
    cases.append(("P=4 --ulysses 2 window ring bf16 L=137", 4,
                  hybrid + masks["window"] + ["--seq-len", "137", "--schedule", "ring", "--dtype", "bf16"], {}))
    cases.append(("P=4 --ulysses 2 documents, round-robin on 2 pretend nodes", 4,
                  hybrid + masks["documents"] + ["--seq-len", "137"], {"RINGATTN_TEST_NODES": "0,1,0,1"}))
    # Ranks sharing one GPU: the host-staged MPI path.
    cases.append(("P=2 sharing one GPU: --comm mpi (host-staged)", 2,
                  ["--backend", "cuda", "--comm", "mpi", "--backward", "--causal", "--seq-len", "96"] + SMALL,
                  {"RINGATTN_EMULATED_GPUS": "1"}))
    cases.append(("P=2 sharing one GPU: --comm mpi (host-staged) --ulysses 2", 2,
                  ["--backend", "cuda", "--comm", "mpi", "--backward", "--causal", "--seq-len", "96", "--ulysses", "2",
                   "--heads", "2", "--head-dim", "16", "--check"], {"RINGATTN_EMULATED_GPUS": "1"}))
    return cases


def layer_files(w, batch=2, seq_len=67, d_model=64, heads=4, kv_heads=2, rank=4):
    """Writes x, dy, t (batch, seq_len, d_model) and a folder W of a layer's weights (W0, biases and LoRA
    factors of q, k, v, o) into w; returns the layer's arguments for them. (launch/gpu-check.sh
    uses it too.)"""
    D = d_model // heads
    p = lambda name: os.path.join(w, name)
    os.makedirs(p("W"))
    for name, seed, scale in (("x", 1, 1.0), ("dy", 2, 1.0), ("t", 3, 0.5)):
        save(p(name + ".npy"), (batch, seq_len, d_model), uniform(batch * seq_len * d_model, seed, scale))
    shapes = {"q": (heads * D, d_model), "k": (kv_heads * D, d_model), "v": (kv_heads * D, d_model),
              "o": (d_model, heads * D)}
    for i, (proj, (out, inp)) in enumerate(shapes.items()):
        save(p("W/w%s.npy" % proj), (out, inp), uniform(out * inp, 10 + i, 1.7 / math.sqrt(inp)))
        save(p("W/b%s.npy" % proj), (out,), uniform(out, 20 + i, 0.5))
        save(p("W/lora_%s_A.npy" % proj), (rank, inp), uniform(rank * inp, 30 + i, 1.7 / math.sqrt(inp)))
        save(p("W/lora_%s_B.npy" % proj), (out, rank), uniform(out * rank, 40 + i, 0.5))
    return ["--x", p("x.npy"), "--weights", p("W"), "--heads", str(heads), "--kv-heads", str(kv_heads),
            "--lora-alpha", str(2 * rank)]


def layer_cases(report):
    w = tempfile.mkdtemp(prefix="ringattn_layer_")
    try:
        files = layer_files(w) + ["--threads", "1"]
        p = lambda name: os.path.join(w, name)
        nccl = ["--backend", "cuda", "--comm", "nccl"]
        rope = ["--causal", "--rope-theta", "10000"]
        checked = {
            "fp32, RoPE and biases, zigzag": rope + ["--dtype", "fp32"],
            "bf16 GEMMs and ring, interleaved partial RoPE, striped": rope + [
                "--dtype", "bf16", "--rope-interleaved", "--rope-dims", "8", "--layout", "striped"],
        }
        for name, extra in checked.items():
            args = ["layer"] + files + nccl + extra + ["--dy", p("dy.npy"), "--check"]
            code, out, err, seconds = run(args, 2)
            ok = code == 0 and "check     passed" in out and "backend cuda" in out and "comm nccl" in out
            report("layer P=2 on cuda/nccl, %s: --check (Y, dX, dA/dB) against the CPU (%.1f s)" % (name, seconds),
                   ok, " ".join(args) + "\n" + out + err)
        # Ranks sharing one GPU: parameters and gradients over MPI through host memory.
        args = ["layer"] + files + ["--backend", "cuda", "--comm", "mpi", "--causal", "--dy", p("dy.npy"), "--check"]
        code, out, err, seconds = run(args, 2, {"RINGATTN_EMULATED_GPUS": "1"})
        report("layer P=2 sharing one GPU (--comm mpi, host-staged): --check (%.1f s)" % seconds,
               code == 0 and "check     passed" in out, " ".join(args) + "\n" + out + err)
        # Training: the same losses and trained output as the CPU backend.
        results = {}
        for backend in ("cpu", "cuda"):
            args = ["layer"] + files + rope + ["--backend", backend, "--target", p("t.npy"), "--steps", "3",
                                               "--lr", "0.01", "--json", p(backend + ".json"), "--out",
                                               p("y_" + backend + ".npy")]
            if backend == "cuda":
                args += ["--comm", "nccl"]
            code, out, err, seconds = run(args, 2)
            if code != 0:
                report("layer P=2 training on %s (%.1f s)" % (backend, seconds), False,
                       " ".join(args) + "\n" + out + err)
                return
            with open(p(backend + ".json")) as f:
                results[backend] = (json.load(f)["losses"], load(p("y_" + backend + ".npy"))[1])
        (cpu_losses, cpu_y), (cuda_losses, cuda_y) = results["cpu"], results["cuda"]
        loss_err = max(abs(a - b) / abs(b) for a, b in zip(cuda_losses, cpu_losses))
        y_err = max(abs(a - b) for a, b in zip(cuda_y, cpu_y)) / max(abs(b) for b in cpu_y)
        report("layer P=2 --steps 3 on cuda/nccl: losses within %.1e and the trained Y within %.1e of the CPU's" %
               (loss_err, y_err), len(cuda_losses) == 3 and loss_err < 1e-4 and y_err < 1e-4,
               "cuda %s\ncpu  %s" % (cuda_losses, cpu_losses))
    finally:
        shutil.rmtree(w, ignore_errors=True)


def main():
    failures = 0

    def report(name, ok, detail=""):
        nonlocal failures
        print("%s  %s%s" % ("ok  " if ok else "FAIL", name, "" if ok else "\n" + detail), flush=True)
        failures += 0 if ok else 1

    if ARGS.group == "attention":
        for name, np, args, env in attention_cases():
            code, out, err, seconds = run(args, np, env)
            ok = code == 0 and "check     passed" in out and ("comm nccl" in out) == ("--comm nccl" in " ".join(args))
            report("%s (%.1f s)" % (name, seconds), ok, " ".join(args) + "\n" + out + err)
        # The scaling benchmark through the same API, a context per point: over NCCL (whose
        # emulation spans the whole job, so one rank count) and host-staged on sub-communicators.
        bench = ["bench", "--backend", "cuda", "--ulysses", "1,2", "--seq-len", "128", "--heads", "2", "--head-dim",
                 "16", "--iters", "1", "--warmup", "0"]
        for name, args, env in (("--comm nccl P=2", bench + ["--comm", "nccl", "--ranks", "2"], {}),
                                ("--comm mpi P=1,2 bf16", bench + ["--comm", "mpi", "--dtype", "bf16"],
                                 {"RINGATTN_EMULATED_GPUS": "1"})):
            code, out, err, seconds = run(args, 2, env)
            report("bench %s U=1,2 (%.1f s)" % (name, seconds), code == 0 and "# OK: every point matches" in out,
                   " ".join(args) + "\n" + out + err)
    elif ARGS.group == "layer":
        layer_cases(report)
        code, out, err, seconds = run(["layer", "--demo", "--seq-len", "64", "--heads", "2", "--d-model", "32",
                                       "--steps", "2", "--causal", "--threads", "1", "--backend", "cuda", "--comm",
                                       "nccl"], 2)
        report("layer demo at P=2 on cuda/nccl (%.1f s)" % seconds, code == 0 and "comm nccl" in out, out + err)
    elif ARGS.group == "faults":
        # Rank 1 stops after its third step (forward's 2 and backward's first): rank 0 waits for
        # a step that rank 1 never joins.
        args = ["--backend", "cuda", "--comm", "nccl", "--backward", "--causal", "--seq-len", "256", "--heads", "2",
                "--head-dim", "16", "--timeout", "5"]
        # (limit: a bound only a hang reaches; the run takes about 10 s on a quiet machine.)
        code, out, err, seconds = run(args, 2, {"RINGATTN_TEST_RAISE": "1:3:STOP"}, limit=180)
        errors = [l for l in err.splitlines() if "error" in l]
        names = any("rank 0" in l and "step" in l and "timed out after 5 s" in l for l in errors)
        report("a rank stopped mid-backward: exit 4 within the timeout, rank and step named (%.1f s, exit %s)" %
               (seconds, code), code == 4 and names, out + err)
        # More ranks on a node than GPUs: a usage error naming both counts.
        code, out, err, seconds = run(["--backend", "cuda", "--comm", "nccl", "--seq-len", "64", "--heads", "2",
                                       "--head-dim", "16"], 3, {"RINGATTN_EMULATED_GPUS": "2"}, limit=60)
        report("3 ranks on 2 GPUs with --comm nccl: exit 2 naming both counts (exit %s)" % code,
               code == 2 and "3 ranks on 2 GPUs" in err, out + err)
    return 1 if failures else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ringattn", required=True)
    parser.add_argument("--mpiexec", default="mpirun")
    parser.add_argument("group", choices=["attention", "layer", "faults"])
    ARGS = parser.parse_args()
    sys.exit(main())
