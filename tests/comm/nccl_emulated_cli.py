#!/usr/bin/env python3
"""The ringattn program built with -DRINGATTN_CUDA_EMULATION=ON: the CUDA backend's and the NCCL
communicator's own code on the CPU emulation of CUDA and NCCL.

  attention   forward and backward checked against fp64 (--check, exit 0) for causal/zigzag,
              window, documents and BigBird masks, both schedules, an uneven length, P = 1..4,
              fp32 and bf16, over --comm nccl; the hybrid (--ulysses 2: the group's NCCL
              communicator by ncclCommSplit, its all-to-all on the device) at P = 2 and 4, the
              latter also with ranks placed round-robin on two pretend nodes; and over --comm mpi
              (host-staged) with 2 ranks sharing one emulated GPU, the hybrid included
  layer       the LoRA layer at P = 2 (its attention runs on the CPU backend)
  faults      a rank stopped (SIGSTOP) mid-backward: exit 4 within the timeout, the error names
              the rank and the step, and teardown does not hang; more ranks than GPUs on a node
              with --comm nccl: a usage error naming both counts

Sizes are tiny: emulated kernels run threads as fibers on one core.
"""
import argparse
import os
import signal
import subprocess
import sys
import time

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
    elif ARGS.group == "layer":
        code, out, err, seconds = run(["layer", "--demo", "--seq-len", "64", "--heads", "2", "--d-model", "32",
                                       "--steps", "2", "--causal", "--threads", "1"], 2)
        report("layer at P=2 (%.1f s)" % seconds, code == 0, out + err)
    elif ARGS.group == "faults":
        # Rank 1 stops after its third step (forward's 2 and backward's first): rank 0 waits for
        # a step that rank 1 never joins.
        args = ["--backend", "cuda", "--comm", "nccl", "--backward", "--causal", "--seq-len", "256", "--heads", "2",
                "--head-dim", "16", "--timeout", "5"]
        code, out, err, seconds = run(args, 2, {"RINGATTN_TEST_RAISE": "1:3:STOP"}, limit=90)
        errors = [l for l in err.splitlines() if "error" in l]
        names = any("rank 0" in l and "step" in l and "timed out after 5 s" in l for l in errors)
        report("a rank stopped mid-backward: exit 4 within the timeout, rank and step named (%.1f s, exit %s)" %
               (seconds, code), code == 4 and names and seconds < 40, out + err)
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
