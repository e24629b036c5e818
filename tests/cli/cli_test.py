#!/usr/bin/env python3
"""The ringattn command under mpirun, as a user meets it when something goes wrong (issue 7).

    cli_test.py --ringattn build/ringattn --mpiexec mpirun GROUP...

Groups (each a ctest test, see tests/CMakeLists.txt):
  bad_inputs  every bad input and unsupported combination, on 2 ranks: exit code 2, a message
              naming the option or file, printed once (by rank 0)
  agreement   ranks started with different options, inputs or environments (Open MPI MPMD): exit code 2
  numerics    empty rows, |scores| ~ 1e4, values near the bfloat16 maximum, one row per rank:
              --check passes and the outputs hold no NaN; outputs appear complete or not at all
  binding     a rank bound to fewer cores than --threads: one warning naming the fix (on 1 or 2
              ranks); none when unbound or at the default --threads
  faults      a rank killed or stopped mid-run, SIGTERM/SIGINT to mpirun, a full disk (ulimit -f):
              every rank ends within the timeout bound, exit 4 (or the signal's), no process and
              no output file left behind

Inputs are written as .npy files here (no NumPy needed) in a temporary folder that is removed
at the end. Every run carries a unique RINGATTN_CLI_TEST_TAG in its environment, which the
ranks inherit: after each run the test looks for live processes carrying it (left behind),
fails if there are any, and ends them by process id.
"""
import argparse
import concurrent.futures
import math
import os
import random
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import time
import uuid

# ---- .npy files ------------------------------------------------------------------------------

CODES = {"<f4": "f", "<f8": "d", "<f2": "e", "<i4": "i", "<i8": "q", "|u1": "B", ">f4": "f"}


def npy_header(descr, shape, fortran=False, header_len=None):
    shape_text = "(%s)" % (", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else ""))
    text = "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (descr, fortran, shape_text)
    text += " " * ((64 - (10 + len(text) + 1) % 64) % 64) + "\n"
    length = len(text) if header_len is None else header_len
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", length) + text.encode()


def save(path, shape, values, descr="<f4", fortran=False):
    order = ">" if descr[0] == ">" else "<"
    data = struct.pack("%s%d%s" % (order, len(values), CODES[descr]), *values)
    with open(path, "wb") as f:
        f.write(npy_header(descr, shape, fortran) + data)
    return path


def load(path):
    """(shape, values) of a little-endian float32 .npy file we wrote."""
    with open(path, "rb") as f:
        raw = f.read()
    assert raw[:6] == b"\x93NUMPY", path
    n = struct.unpack("<H", raw[8:10])[0]
    header = raw[10:10 + n].decode()
    assert "'<f4'" in header and "False" in header, header
    shape = tuple(int(d) for d in header.split("(")[1].split(")")[0].split(",") if d.strip())
    count = math.prod(shape)
    return shape, struct.unpack("<%df" % count, raw[10 + n:10 + n + 4 * count])


def uniform(count, seed, scale=1.0):
    r = random.Random(seed)
    return [r.uniform(-1.0, 1.0) * scale for _ in range(count)]


# ---- running the command ----------------------------------------------------------------------

BANNER_MARKERS = ("-----", "Primary job", "a non-zero exit", "mpirun detected", "job to be terminated",
                  "Process name", "Exit code", "MPI_ABORT was invoked", "with errorcode", "NOTE: invoking",
                  "You may or may not", "exactly when Open MPI", "mpirun noticed", "Forwarding signal")


# Seconds after which a case counts as hung and is killed: a bound only a hang reaches (every case
# takes a few seconds on a quiet machine, and ranks given --timeout 600 outlive it). No case
# checks how fast it ran: a busy machine must not fail a test (docs/testing.md).
HANG_LIMIT = 180.0

SANITIZER_MARKERS = ("ERROR: AddressSanitizer", "runtime error:", "ERROR: LeakSanitizer")


def ringattn_lines(text):
    """The lines ringattn printed, without Open MPI's banners."""
    return [l for l in text.splitlines() if l.strip() and not any(m in l for m in BANNER_MARKERS)]


class Result:
    def __init__(self, code, out, err, seconds, leftovers):
        self.code, self.out, self.err, self.seconds, self.leftovers = code, out, err, seconds, leftovers

    def describe(self):
        return "exit %s after %.1f s\n  stderr: %s\n  stdout: %s" % (
            self.code, self.seconds, "\n          ".join(ringattn_lines(self.err)[:40]) or "(empty)",
            "\n          ".join(self.out.splitlines()[:12]) or "(empty)")


def tagged_processes(tag):
    """Live processes (not zombies) whose environment carries this run's tag."""
    needle = ("RINGATTN_CLI_TEST_TAG=" + tag).encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open("/proc/%s/environ" % entry, "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open("/proc/%s/stat" % entry) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            if state != "Z":
                found.append(int(entry))
        except OSError:
            continue
    return found


def rank_pid(tag, rank, timeout=30.0):
    """The process id of `rank` of a running job (Open MPI sets OMPI_COMM_WORLD_RANK)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in tagged_processes(tag):
            try:
                with open("/proc/%d/environ" % pid, "rb") as f:
                    env = f.read().split(b"\0")
                with open("/proc/%d/cmdline" % pid, "rb") as f:
                    is_ringattn = b"ringattn" in f.read().split(b"\0")[0]
            except OSError:
                continue
            if is_ringattn and ("OMPI_COMM_WORLD_RANK=%d" % rank).encode() in env:
                return pid
        time.sleep(0.05)
    raise AssertionError("rank %d never started" % rank)


class Runner:
    def __init__(self, ringattn, mpiexec, workdir):
        self.ringattn, self.mpiexec, self.workdir = ringattn, mpiexec, workdir
        self.flags = ["--oversubscribe", "--bind-to", "none"]

    def command(self, args, np=2, mpmd=None, mca=None, wrapper=None):
        program = [self.ringattn] if wrapper is None else wrapper + [self.ringattn]
        if np is None and mpmd is None:  # without mpirun: a job of one rank
            return program + args
        cmd = [self.mpiexec] + self.flags + (mca or [])
        if mpmd is None:
            return cmd + ["-np", str(np)] + program + args
        for i, (n, part_args, wdir, *env) in enumerate(mpmd):  # env: variables of this part's ranks alone
            exports = [a for name, value in (env[0] if env else {}).items() for a in ("-x", name + "=" + value)]
            cmd += ([":"] if i else []) + ["-np", str(n)] + (["-wdir", wdir] if wdir else []) + exports + program
            cmd += part_args
        return cmd

    def start(self, args, env=None, **kw):
        tag = uuid.uuid4().hex
        full_env = dict(os.environ, RINGATTN_CLI_TEST_TAG=tag, **(env or {}))
        full_env.setdefault("OMPI_MCA_btl_vader_single_copy_mechanism", "none")
        proc = subprocess.Popen(self.command(args, **kw), cwd=self.workdir, env=full_env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, errors="replace")
        proc.tag = tag
        proc.t0 = time.monotonic()
        return proc

    def finish(self, proc, limit=HANG_LIMIT):
        try:
            out, err = proc.communicate(timeout=max(1.0, limit - (time.monotonic() - proc.t0)))
        except subprocess.TimeoutExpired:
            proc.terminate()  # mpirun ends its ranks
            try:
                out, err = proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            err += "\n[cli_test: killed after %.0f s]" % limit
        seconds = time.monotonic() - proc.t0
        leftovers = []
        for _ in range(50):  # Open MPI reaps its ranks just after mpirun returns
            leftovers = tagged_processes(proc.tag)
            if not leftovers:
                break
            time.sleep(0.1)
        for pid in leftovers:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        result = Result(proc.returncode, out, err, seconds, leftovers)
        # Under RINGATTN_SANITIZE a finding must fail the test even where a failure is expected.
        expect(not any(m in err for m in SANITIZER_MARKERS), "a sanitizer reported an error", result)
        return result

    def run(self, args, env=None, limit=HANG_LIMIT, **kw):
        return self.finish(self.start(args, env=env, **kw), limit)


# ---- checks ---------------------------------------------------------------------------------

class Failure(Exception):
    pass


def expect(condition, what, result=None):
    if not condition:
        raise Failure(what + ("\n  " + result.describe() if result else ""))


def expect_exit(result, code, needles=(), once=True):
    """Exit `code`, every needle in one of ringattn's error lines, each error printed once."""
    expect(not result.leftovers, "processes left behind: %s" % result.leftovers, result)
    expect(result.code == code, "expected exit code %d" % code, result)
    lines = ringattn_lines(result.err)
    errors = [l for l in lines if l.startswith("ringattn: error:")]
    if code == 2:
        expect(errors, "no 'ringattn: error:' line", result)
        if once:
            expect(len(errors) == len(set(errors)) and len(errors) == 1, "the error is not printed exactly once",
                   result)
    for needle in needles:
        expect(any(needle in l for l in errors or lines), "no error line contains %r" % needle, result)


def outputs_left(workdir, name):
    return sorted(f for f in os.listdir(workdir) if f == name or f.startswith(name + ".tmp-"))


# ---- the groups -------------------------------------------------------------------------------

L, H, HKV, D = 64, 4, 2, 16
LAYER = ["layer", "--demo", "--steps", "1", "--seq-len", str(L), "--d-model", str(H * D), "--heads", str(H)]
BENCH = ["bench", "--ranks", "2", "--seq-len", str(L), "--heads", str(H), "--head-dim", str(D), "--iters", "1"]


def make_inputs(w):
    """Good and bad input files in folder w; returns their paths by name."""
    p = lambda name: os.path.join(w, name)
    f = {}
    f["q"] = save(p("q.npy"), (L, H, D), uniform(L * H * D, 1))
    f["k"] = save(p("k.npy"), (L, HKV, D), uniform(L * HKV * D, 2))
    f["v"] = save(p("v.npy"), (L, HKV, D), uniform(L * HKV * D, 3))
    f["dout"] = save(p("dout.npy"), (L, H, D), uniform(L * H * D, 4))
    with open(p("not_npy.npy"), "w") as out:
        out.write("a,b,c\n1,2,3\n")
    open(p("empty.npy"), "wb").close()
    good = npy_header("<f4", (L, H, D))
    with open(p("corrupt_header.npy"), "wb") as out:
        out.write(good.replace(b"'shape'", b"'shapf'") + bytes(4 * L * H * D))
    with open(p("truncated_header.npy"), "wb") as out:
        out.write(npy_header("<f4", (L, H, D), header_len=4000)[:80])
    with open(p("truncated_data.npy"), "wb") as out:
        out.write(good + bytes(4 * L * H * D // 2))
    with open(p("absurd_shape.npy"), "wb") as out:
        out.write(npy_header("<f4", (10 ** 15, H, D)) + bytes(4096))
    with open(p("overflow_shape.npy"), "wb") as out:
        out.write(npy_header("<f4", (2 ** 40, 2 ** 40, D)) + bytes(4096))
    save(p("fortran.npy"), (L, H, D), uniform(L * H * D, 1), fortran=True)
    save(p("int32.npy"), (L, H, D), [1] * (L * H * D), descr="<i4")
    save(p("big_endian.npy"), (L, H, D), uniform(L * H * D, 1), descr=">f4")
    save(p("q_f64.npy"), (L, H, D), uniform(L * H * D, 1), descr="<f8")
    save(p("q_f16.npy"), (L, H, D), uniform(L * H * D, 1), descr="<f2")
    big = uniform(L * H * D, 1)
    big[1000] = 1e39
    save(p("q_f64_beyond_f32.npy"), (L, H, D), big, descr="<f8")
    save(p("q_L32.npy"), (32, H, D), uniform(32 * H * D, 1))
    save(p("v_hkv1.npy"), (L, 1, D), uniform(L * D, 3))
    save(p("q_h3.npy"), (L, 3, D), uniform(L * 3 * D, 1))
    save(p("q_d8.npy"), (L, H, 8), uniform(L * H * 8, 1))
    save(p("k_d8.npy"), (L, HKV, 8), uniform(L * HKV * 8, 2))
    save(p("v_d8.npy"), (L, HKV, 8), uniform(L * HKV * 8, 3))
    save(p("q_2d.npy"), (L, H * D), uniform(L * H * D, 1))
    save(p("q_L1.npy"), (1, H, D), uniform(H * D, 1))
    save(p("k_L1.npy"), (1, HKV, D), uniform(HKV * D, 2))
    save(p("v_L1.npy"), (1, HKV, D), uniform(HKV * D, 3))
    nan = uniform(L * H * D, 1)
    nan[5 * H * D + 3] = float("nan")  # sequence position 5
    save(p("q_nan.npy"), (L, H, D), nan)
    inf = uniform(L * HKV * D, 3)
    inf[40 * HKV * D] = float("inf")  # sequence position 40: rank 1's rows
    save(p("v_inf.npy"), (L, HKV, D), inf)
    save(p("dout_nan.npy"), (L, H, D), nan)
    save(p("dout_L32.npy"), (32, H, D), uniform(32 * H * D, 4))
    beyond_bf16 = uniform(L * HKV * D, 2)
    beyond_bf16[7] = 3.4e38  # finite in float32, inf in bfloat16 (beyond 3.3962e38 it rounds up)
    save(p("k_beyond_bf16.npy"), (L, HKV, D), beyond_bf16)
    save(p("doc_f32.npy"), (2,), [32.0, 32.0])
    save(p("doc_2d.npy"), (1, 2), [32, 32], descr="<i8")
    save(p("doc_ok.npy"), (2,), [32, 32], descr="<i8")
    blocks = L // 16
    save(p("bm_3x3.npy"), (3, 3), [1] * 9, descr="|u1")
    save(p("bm_f32.npy"), (blocks, blocks), [1.0] * blocks * blocks)
    save(p("bm_ok.npy"), (blocks, blocks), [1] * blocks * blocks, descr="|u1")
    os.mkdir(p("folder.npy"))
    os.mkfifo(p("fifo.npy"))
    save(p("unreadable.npy"), (L, H, D), uniform(L * H * D, 1))
    os.chmod(p("unreadable.npy"), 0)
    return f


def bad_input_cases(w):
    """(name, args, env, needles): each must end with exit code 2 and name what is wrong."""
    files = ["--q", "q.npy", "--k", "k.npy", "--v", "v.npy"]
    with_q = lambda q: ["--q", q, "--k", "k.npy", "--v", "v.npy"]
    small = ["--seq-len", "64", "--head-dim", "16", "--heads", "4"]
    cases = [
        # files
        ("missing file", with_q("missing.npy"), None, ["--q missing.npy", "cannot open", "No such file"]),
        ("folder instead of file", with_q("folder.npy"), None, ["--q folder.npy", "is a directory"]),
        ("fifo instead of file", with_q("fifo.npy"), None, ["--q fifo.npy", "not a regular file"]),
        ("empty file", with_q("empty.npy"), None, ["--q empty.npy", "not a .npy file"]),
        ("not an .npy", with_q("not_npy.npy"), None, ["--q not_npy.npy", "not a .npy file", "bad magic"]),
        ("corrupt header", with_q("corrupt_header.npy"), None, ["--q corrupt_header.npy", "corrupt .npy header"]),
        ("truncated header", with_q("truncated_header.npy"), None, ["--q truncated_header.npy", "truncated header"]),
        ("truncated data", with_q("truncated_data.npy"), None, ["--q truncated_data.npy", "truncated data"]),
        ("absurd shape", with_q("absurd_shape.npy"), None,
         ["--q absurd_shape.npy", "header claims shape (1000000000000000, 4, 16)", "the file holds 4096 bytes"]),
        ("shape overflows", with_q("overflow_shape.npy"), None, ["--q overflow_shape.npy", "overflows 64 bits"]),
        ("Fortran order", with_q("fortran.npy"), None, ["--q fortran.npy", "Fortran order is not supported"]),
        ("int32 tensor", with_q("int32.npy"), None, ["--q int32.npy", "dtype int32"]),
        ("big-endian", with_q("big_endian.npy"), None, ["--q big_endian.npy", "big-endian"]),
        ("2-D tensor", with_q("q_2d.npy"), None, ["--q q_2d.npy", "expected a (B, L, H, D) or (L, H, D) array"]),
        ("Q and K lengths differ", with_q("q_L32.npy"), None, ["--q q_L32.npy", "--k k.npy", "must agree"]),
        ("K and V shapes differ", ["--q", "q.npy", "--k", "k.npy", "--v", "v_hkv1.npy"], None,
         ["--k k.npy has shape (64, 2, 16) but --v v_hkv1.npy has (64, 1, 16)"]),
        ("H not divisible by Hkv (files)", with_q("q_h3.npy"), None,
         ["'s heads 2 must divide --q q_h3.npy's heads 3"]),
        ("H not divisible by Hkv", small + ["--kv-heads", "3"], None, ["--kv-heads 3 must divide --heads 4"]),
        ("unsupported head dim (files)", ["--q", "q_d8.npy", "--k", "k_d8.npy", "--v", "v_d8.npy"], None,
         ["--q q_d8.npy's head dim 8 is not supported"]),
        ("unsupported head dim", ["--seq-len", "64", "--head-dim", "20"], None,
         ["--head-dim 20 is not supported"]),
        ("L smaller than ranks (files)", ["--q", "q_L1.npy", "--k", "k_L1.npy", "--v", "v_L1.npy"], None,
         ["--q q_L1.npy's length 1 is smaller than the number of ranks 2"]),
        ("L smaller than ranks", ["--seq-len", "1", "--head-dim", "16"], None,
         ["--seq-len 1 is smaller than the number of ranks 2"]),
        ("NaN in Q", with_q("q_nan.npy"), None, ["--q q_nan.npy", "contains NaN", "sequence position 5"]),
        ("Inf in V", ["--q", "q.npy", "--k", "k.npy", "--v", "v_inf.npy"], None,
         ["--v v_inf.npy", "contains Inf", "sequence position 40"]),
        ("NaN in dO", files + ["--dout", "dout_nan.npy"], None, ["--dout dout_nan.npy", "contains NaN"]),
        ("float64 beyond float32", with_q("q_f64_beyond_f32.npy"), None,
         ["--q q_f64_beyond_f32.npy", "beyond the float32 range"]),
        ("beyond bfloat16", ["--q", "q.npy", "--k", "k_beyond_bf16.npy", "--v", "v.npy", "--dtype", "bf16"], None,
         ["--k k_beyond_bf16.npy", "value 3.4e+38", "overflows bfloat16"]),
        ("dO shape differs", files + ["--dout", "dout_L32.npy"], None, ["--dout dout_L32.npy has shape (32, 4, 16)"]),
        # masks
        ("negative window", small + ["--window", "-2,3"], None, ["--window (-2, 3)", "-1 for unbounded"]),
        ("window of one number", small + ["--window", "5"], None, ["--window 5", "expected 2"]),
        ("window not integers", small + ["--window", "a,b"], None, ["--window a,b", "not an integer"]),
        ("doc lengths do not sum to L", small + ["--doc-lens", "10,20"], None,
         ["--doc-lens sum to 30 but the sequence length is 64"]),
        ("negative doc length", small + ["--doc-lens", "80,-16"], None, ["--doc-lens must not be negative (-16)"]),
        ("doc lengths overflow", small + ["--doc-lens", "9223372036854775807,1"], None, ["--doc-lens", "overflow"]),
        ("doc lengths file of floats", small + ["--doc-lens", "doc_f32.npy"], None, ["--doc-lens doc_f32.npy", "dtype"]),
        ("doc lengths file 2-D", small + ["--doc-lens", "doc_2d.npy"], None, ["--doc-lens doc_2d.npy", "1-D"]),
        ("block mask of wrong shape", small + ["--block-mask", "bm_3x3.npy", "--mask-block", "16"], None,
         ["--block-mask bm_3x3.npy", "expected shape (4, 4)"]),
        ("block mask of floats", small + ["--block-mask", "bm_f32.npy", "--mask-block", "16"], None,
         ["--block-mask bm_f32.npy", "dtype float32"]),
        ("block mask and bigbird", small + ["--block-mask", "bm_ok.npy", "--bigbird", "1,1,1", "--mask-block", "16"],
         None, ["--block-mask and --bigbird"]),
        ("mask block zero", small + ["--block-mask", "bm_ok.npy", "--mask-block", "0"], None, ["--mask-block 0"]),
        ("bigbird of two numbers", small + ["--bigbird", "1,2"], None, ["--bigbird 1,2", "expected 3"]),
        # options
        ("unknown option", ["--bogus"], None, ["unrecognised option '--bogus'"]),
        ("unknown subcommand", ["frobnicate"], None, ["unknown subcommand 'frobnicate'"]),
        ("not a number", ["--seq-len", "many"], None, ["seq-len"]),
        ("empty value", small + ["--out", ""], None, ["--out is given an empty value"]),
        ("option twice", ["--seq-len", "64", "--seq-len", "128"], None, ["seq-len", "more than once"]),
        ("zero batch", small + ["--batch", "0"], None, ["--batch 0 must be positive"]),
        ("negative kv-heads", small + ["--kv-heads", "-1"], None, ["--kv-heads -1"]),
        ("tensors too large", ["--seq-len", "4611686018427387904", "--heads", "1024", "--head-dim", "16"], None,
         ["too large"]),
        ("bad dtype", small + ["--dtype", "fp16"], None, ["--dtype fp16"]),
        ("bad layout", small + ["--layout", "diagonal"], None, ["--layout", "diagonal"]),
        ("bad schedule", small + ["--schedule", "tree"], None, ["--schedule", "tree"]),
        ("cuda backend without GPU build", small + ["--backend", "cuda"], None, ["--backend cuda"]),
        ("nccl without cuda", small + ["--comm", "nccl"], None, ["--comm nccl"]),
        ("zero iters", small + ["--iters", "0"], None, ["--iters 0"]),
        ("unknown instruction set", small, {"RINGATTN_ISA": "avx9000"}, ["RINGATTN_ISA=avx9000"]),
        ("negative warmup", small + ["--warmup", "-1"], None, ["--warmup -1"]),
        ("negative threads", small + ["--threads", "-2"], None, ["--threads -2"]),
        ("zero timeout", small + ["--timeout", "0"], None, ["--timeout"]),
        ("NaN timeout", small + ["--timeout", "nan"], None, ["--timeout"]),
        ("negative scale", small + ["--scale", "-1"], None, ["--scale"]),
        ("scale 0 in fp32", small + ["--scale", "1e-50"], None, ["--scale"]),
        ("NaN bandwidth", small + ["--emulate-bandwidth", "nan"], None, ["--emulate-bandwidth"]),
        ("zero check rows", small + ["--check", "--check-rows", "0"], None, ["--check-rows 0"]),
        ("check-finite contradiction", files + ["--check-finite", "--no-check-finite"], None, ["contradict"]),
        # combinations that would be silently ignored
        ("Q without K and V", ["--q", "q.npy"], None, ["--q, --k and --v go together"]),
        ("shape option that disagrees with the files", files + ["--seq-len", "32"], None,
         ["--seq-len 32 disagrees with the input files", "which give 64"]),
        ("kv-heads that disagrees with the files", files + ["--heads", "4", "--kv-heads", "4"], None,
         ["--kv-heads 4 disagrees with the input files", "which give 2"]),
        ("dO without files", small + ["--dout", "dout.npy"], None, ["--dout needs --q/--k/--v files"]),
        ("dO and --backward", files + ["--dout", "dout.npy", "--backward"], None, ["--dout and --backward"]),
        ("gradient without backward", small + ["--dq", "dq.npy"], None, ["--dq/--dk/--dv", "need --backward or --dout"]),
        ("dump without block mask", small + ["--dump-block-mask", "bm.npy"], None, ["--dump-block-mask needs a block mask"]),
        ("mask block without block mask", small + ["--mask-block", "32"], None,
         ["--mask-block has no effect without a block mask"]),
        ("seed with files and nothing random", files + ["--seed", "3"], None, ["--seed has no effect"]),
        ("check rows without check", small + ["--check-rows", "4"], None, ["--check-rows has no effect without --check"]),
        ("no-check-finite with random inputs", small + ["--no-check-finite"], None, ["--no-check-finite has no effect"]),
        ("two outputs to one file", small + ["--out", "o.npy", "--lse", "./o.npy"], None,
         ["--lse ./o.npy: the same file as --out o.npy"]),
        ("output over an input", files + ["--out", "q.npy"], None, ["--out q.npy: the same file as the input --q"]),
        ("output in a missing folder", small + ["--out", "no/such/folder/o.npy"], None,
         ["--out no/such/folder/o.npy: the folder no/such/folder does not exist"]),
        ("output is a folder", small + ["--lse", "folder.npy"], None, ["--lse folder.npy: is a directory"]),
        ("json in a missing folder", small + ["--json", "nowhere/run.json"], None, ["--json nowhere/run.json"]),
        ("json over an output", small + ["--out", "o.npy", "--json", "o.npy"], None, ["--json o.npy: the same file as --out"]),
        ("malformed test hook", small, {"RINGATTN_TEST_RAISE": "1:x"}, ["RINGATTN_TEST_RAISE=1:x"]),
        # the tests' pretend nodes, read where each job places its --ulysses groups
        ("pretend nodes not a list", small + ["--ulysses", "2"], {"RINGATTN_TEST_NODES": "a,b"},
         ["RINGATTN_TEST_NODES=a,b: not a comma-separated list of node ids"]),
        ("pretend nodes not a list (layer)", LAYER + ["--ulysses", "2"], {"RINGATTN_TEST_NODES": "a,b"},
         ["RINGATTN_TEST_NODES=a,b: not a comma-separated list of node ids"]),
        ("pretend nodes for other ranks (layer)", LAYER + ["--ulysses", "2"], {"RINGATTN_TEST_NODES": "0,1,0"},
         ["RINGATTN_TEST_NODES=0,1,0: 3 node ids for 2 ranks"]),
        ("pretend nodes for other ranks (bench)", BENCH + ["--ulysses", "2"], {"RINGATTN_TEST_NODES": "0,1,0"},
         ["RINGATTN_TEST_NODES=0,1,0: 3 node ids for 2 ranks"]),
        ("ulysses that does not divide the ranks (layer)", LAYER + ["--ulysses", "3"], None,
         ["--ulysses 3 does not divide the 2 ranks"]),
    ]
    if os.geteuid() != 0:  # root reads any file
        cases.append(("unreadable file", with_q("unreadable.npy"), None, ["--q unreadable.npy", "Permission denied"]))
    return cases


def group_bad_inputs(runner, w, jobs):
    make_inputs(w)
    cases = bad_input_cases(w)

    def one(case):
        name, args, env, needles = case
        result = runner.run(args, env=env, limit=HANG_LIMIT)
        expect_exit(result, 2, needles)
        return name

    return run_cases(cases, one, jobs)


def run_cases(cases, one, jobs):
    failures = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(one, c): c[0] for c in cases}
        for future in concurrent.futures.as_completed(futures):
            try:
                print("ok    %s" % future.result(), flush=True)
            except Failure as e:
                failures.append(futures[future])
                print("FAIL  %s: %s" % (futures[future], e), flush=True)
    return failures


def group_agreement(runner, w, jobs):
    f = make_inputs(w)
    a, b = os.path.join(w, "rank0"), os.path.join(w, "rank1")
    os.mkdir(a)
    os.mkdir(b)
    for name in ("q", "k", "v"):
        shutil.copy(f[name], a)
    save(os.path.join(b, "q.npy"), (L, H, D), uniform(L * H * D, 1))
    save(os.path.join(b, "k.npy"), (L, 1, D), uniform(L * D, 2))  # same name, another shape
    save(os.path.join(b, "v.npy"), (L, 1, D), uniform(L * D, 3))
    small = ["--head-dim", "16", "--heads", "4"]
    files = ["--q", "q.npy", "--k", "k.npy", "--v", "v.npy"]
    cases = [
        ("different seq-len", [(1, small + ["--seq-len", "256"], None), (1, small + ["--seq-len", "512"], None)],
         ["--seq-len is '256' on rank 0 but '512' on rank 1"]),
        ("option only on rank 1", [(1, small, None), (1, small + ["--causal"], None)],
         ["--causal is 'false' on rank 0 but 'true' on rank 1"]),
        ("bad option on rank 1 only", [(1, small, None), (1, small + ["--bogus"], None)],
         ["rank 1: unrecognised option '--bogus'"]),
        ("--help on rank 1 only", [(1, small, None), (1, small + ["--help"], None)],
         ["--help is given on rank 1 but not on rank 0"]),
        ("no options against the same defaults spelled out", [(1, [], None), (1, ["--seq-len", "8192"], None)],
         ["the ranks were started with different options"]),
        ("different subcommands", [(1, ["attention"] + small, None), (1, ["bench"] + small, None)],
         ["different subcommands: 'attention' on rank 0 but 'bench' on rank 1"]),
        ("same option, different file contents", [(1, files, a), (1, files, b)],
         ["the ranks read different inputs", "--k k.npy", "(64, 2, 16) on rank 0 but", "(64, 1, 16) on rank 1"]),
        ("bad pretend nodes on rank 1 only (layer)",
         [(1, LAYER + ["--ulysses", "2"], None), (1, LAYER + ["--ulysses", "2"], None, {"RINGATTN_TEST_NODES": "x"})],
         ["rank 1: RINGATTN_TEST_NODES=x: not a comma-separated list of node ids"]),
    ]

    def one(case):
        name, mpmd, needles = case
        result = runner.run([], mpmd=mpmd, limit=HANG_LIMIT)
        expect_exit(result, 2, needles)
        return name

    return run_cases(cases, one, jobs)


def expect_finite_outputs(w, names):
    for name in names:
        shape, values = load(os.path.join(w, name))
        bad = [x for x in values if math.isnan(x) or (math.isinf(x) and not name.startswith("lse"))]
        expect(not bad, "%s holds %d NaN (or Inf) values" % (name, len(bad)))
        expect(outputs_left(w, name) == [name], "%s: temporary files left: %s" % (name, outputs_left(w, name)))


def group_numerics(runner, w, jobs):
    make_inputs(w)
    p = lambda name: os.path.join(w, name)
    blocks = L // 16
    empty_row = [0 if r == 1 else 1 for r in range(blocks) for c in range(blocks)]
    save(p("bm_empty_row.npy"), (blocks, blocks), empty_row, descr="|u1")
    save(p("q_huge.npy"), (L, H, D), uniform(L * H * D, 11, 200.0))
    save(p("k_huge.npy"), (L, HKV, D), uniform(L * HKV * D, 12, 200.0))
    save(p("v_near_bf16_max.npy"), (L, HKV, D), uniform(L * HKV * D, 13, 3.3e38))
    save(p("v_1e36.npy"), (L, HKV, D), uniform(L * HKV * D, 14, 1e36))
    files = lambda q="q.npy", k="k.npy", v="v.npy": ["--q", q, "--k", k, "--v", v]
    cases = [
        ("empty block-mask row: O = 0, LSE = -inf, no NaN",
         files() + ["--block-mask", "bm_empty_row.npy", "--mask-block", "16", "--check", "--check-rows", "64",
                    "--backward", "--out", "o_empty.npy", "--lse", "lse_empty.npy", "--dq", "dq_empty.npy",
                    "--dk", "dk_empty.npy"], "empty"),
        ("|scores| ~ 1e4", files("q_huge.npy", "k_huge.npy") + ["--check", "--check-rows", "64", "--causal",
                                                                "--out", "o_huge.npy", "--lse", "lse_huge.npy"],
         ["o_huge.npy", "lse_huge.npy"]),
        ("|scores| ~ 1e4, bf16", files("q_huge.npy", "k_huge.npy") + [
            "--check", "--check-rows", "64", "--dtype", "bf16", "--out", "o_huge_bf16.npy"], ["o_huge_bf16.npy"]),
        # --check's tolerance grows with the largest |score| (fp32 rounding of the scores, which
        # every implementation carries, scaled by the size of the gradient's terms).
        ("|scores| ~ 1e4, backward, checked", files("q_huge.npy", "k_huge.npy") + [
            "--backward", "--check", "--check-rows", "64", "--dq", "dq_huge.npy", "--dk", "dk_huge.npy",
            "--dv", "dv_huge.npy"],
         ["dq_huge.npy", "dk_huge.npy", "dv_huge.npy"]),
        ("V near the bfloat16 maximum, one key per query", files(v="v_near_bf16_max.npy") + [
            "--dtype", "bf16", "--window", "0,0", "--check", "--check-rows", "64", "--out", "o_bf16max.npy"],
         ["o_bf16max.npy"]),
        ("V ~ 1e36 in bf16, full attention", files(v="v_1e36.npy") + [
            "--dtype", "bf16", "--check", "--check-rows", "64", "--out", "o_1e36.npy"], ["o_1e36.npy"]),
        ("one row per rank", ["--seq-len", "2", "--heads", "4", "--head-dim", "16", "--causal", "--backward",
                              "--check", "--out", "o_L2.npy", "--lse", "lse_L2.npy"], ["o_L2.npy", "lse_L2.npy"]),
        ("one row per rank, striped, ring", ["--seq-len", "2", "--heads", "4", "--head-dim", "16", "--causal",
                                             "--layout", "striped", "--schedule", "ring", "--backward", "--check"], []),
        ("one row per rank, zigzag, bf16", ["--seq-len", "2", "--heads", "4", "--head-dim", "16", "--causal",
                                            "--layout", "zigzag", "--dtype", "bf16", "--check"], []),
        ("float64 input converted, noted once", files("q_f64.npy") + ["--check", "--out", "o_f64.npy"],
         ["o_f64.npy"]),
        ("float16 input converted, noted once", files("q_f16.npy") + ["--check"], []),
        ("shape options that restate the files", files() + ["--seq-len", "64", "--heads", "4", "--kv-heads", "2",
                                                             "--head-dim", "16", "--batch", "1", "--check"], []),
    ]

    def one(case):
        name, args, outputs = case
        result = runner.run(args, limit=HANG_LIMIT)
        expect_exit(result, 0)
        expect("--check" not in args or "check     passed" in result.out, "--check did not pass", result)
        notes = [l for l in ringattn_lines(result.err) if l.startswith("ringattn: note:")]
        if "converted" in name:
            expect(len(notes) == 1 and "converted float" in notes[0], "expected one conversion note", result)
        if outputs == "empty":
            expect_finite_outputs(w, ["o_empty.npy", "lse_empty.npy", "dq_empty.npy", "dk_empty.npy"])
            _, o = load(p("o_empty.npy"))
            _, lse = load(p("lse_empty.npy"))
            row = H * D
            expect(all(x == 0.0 for x in o[16 * row:32 * row]), "O of the empty rows is not 0")
            expect(all(x != 0.0 for x in o[:16 * row]), "O of visible rows is 0")
            for h in range(H):  # LSE is (B, H, L)
                expect(all(x == -math.inf for x in lse[h * L + 16:h * L + 32]), "LSE of the empty rows is not -inf")
                expect(all(math.isfinite(x) for x in lse[h * L:h * L + 16]), "LSE of visible rows is not finite")
            _, dq = load(p("dq_empty.npy"))
            expect(all(x == 0.0 for x in dq[16 * row:32 * row]), "dQ of the empty rows is not 0")
        else:
            expect_finite_outputs(w, outputs)
        return name

    return run_cases(cases, one, jobs)


def group_faults(runner, w, jobs):
    """Each ends with the exit and the message it should, on every rank, and leaves nothing behind;
    that it ends at all is checked by HANG_LIMIT, which only a hang reaches."""
    big = ["--seq-len", "4096", "--heads", "4", "--head-dim", "64"]
    cases = []

    def case(name, fn):
        cases.append((name, fn))

    def stopped_rank():
        # Rank 1 stops after its backward's first step (2 forward steps + 1): rank 0 then waits
        # for the dK/dV that rank 1 owes it.
        r = runner.run(big + ["--backward", "--timeout", "5"], env={"RINGATTN_TEST_RAISE": "1:3:STOP"},
                       limit=HANG_LIMIT)
        # Rank 0 waits for rank 1's K/V or for the dK/dV it owes: either names rank 1 and step 1.
        expect_exit(r, 4, ["timed out after 5 s", "of step 1 from rank 1", "backward pass of repetition 1/1",
                           "rank 1 did not answer a roll call within 1 s"])

    def stopped_rank_forward():
        # Rank 1 stops after its forward's first step: rank 0 finishes the forward pass and waits
        # in the collective after it, which cannot say who is missing: the roll call does.
        r = runner.run(big + ["--timeout", "5"], env={"RINGATTN_TEST_RAISE": "1:1:STOP"}, limit=HANG_LIMIT)
        expect_exit(r, 4, ["timed out after 5 s", "forward pass of repetition 1/1",
                           "rank 1 did not answer a roll call within 1 s"])

    def killed_rank():
        # --timeout 600: ending before it shows that mpirun, not the ranks' timeout, ended the job.
        r = runner.run(big + ["--timeout", "600", "--iters", "3"], env={"RINGATTN_TEST_RAISE": "1:1:KILL"},
                       limit=HANG_LIMIT)
        expect(not r.leftovers, "processes left behind: %s" % r.leftovers, r)
        expect(r.code != 0, "a killed rank must fail the job", r)

    def killed_while_writing():
        r = runner.run(big + ["--timeout", "600", "--out", "o_kill.npy", "--lse", "lse_kill.npy"],
                       env={"RINGATTN_TEST_RAISE": "1:write:KILL"}, limit=HANG_LIMIT)
        expect(not r.leftovers and r.code != 0, "expected a failure", r)
        left = outputs_left(w, "o_kill.npy") + outputs_left(w, "lse_kill.npy")
        expect(not left, "files left: %s" % left, r)

    def signal_to_mpirun_while_writing(sig, name):
        out = "o_%s.npy" % name
        # Rank 1 hangs after writing its rows (not SIGSTOP: mpirun resumes stopped ranks with
        # SIGCONT before it signals them, and the job could then finish before the signal lands).
        proc = runner.start(big + ["--timeout", "600", "--out", out], env={"RINGATTN_TEST_RAISE": "1:write:HANG"})
        deadline = time.monotonic() + HANG_LIMIT
        while not any(f.startswith(out + ".tmp-") for f in os.listdir(w)) and time.monotonic() < deadline:
            time.sleep(0.05)
        expect(time.monotonic() < deadline, "the output's temporary file never appeared")
        time.sleep(0.2)
        proc.send_signal(sig)
        # Ended by the signal: the hanging rank's --timeout (600 s) is past the limit.
        r = runner.finish(proc, limit=time.monotonic() - proc.t0 + HANG_LIMIT)
        expect(not r.leftovers, "processes left behind: %s" % r.leftovers, r)
        expect(r.code != 0 and "killed after" not in r.err, "an interrupted job must fail", r)
        # (Rank 0 prints a line, but mpirun may drop the ranks' output while it ends the job.)
        expect(not outputs_left(w, out), "files left: %s" % outputs_left(w, out), r)

    def signal_to_single_process_while_writing(sig):
        out = "o_single_%d.npy" % sig
        proc = runner.start(big + ["--out", out], env={"RINGATTN_TEST_RAISE": "0:write:HANG"}, np=None)
        deadline = time.monotonic() + HANG_LIMIT
        while not any(f.startswith(out + ".tmp-") for f in os.listdir(w)) and time.monotonic() < deadline:
            time.sleep(0.05)
        expect(time.monotonic() < deadline, "the output's temporary file never appeared")
        proc.send_signal(sig)
        r = runner.finish(proc, limit=time.monotonic() - proc.t0 + HANG_LIMIT)
        expect(not r.leftovers, "processes left behind: %s" % r.leftovers, r)
        expect(r.code == -sig, "expected death by signal %d (exit status %d in a shell)" % (sig, 128 + sig), r)
        name = signal.Signals(sig).name
        expect(any(l == "ringattn: got %s: ending the job; its unfinished outputs were removed" % name
                   for l in ringattn_lines(r.err)), "no line says %s ended the job" % name, r)
        expect(not outputs_left(w, out), "files left: %s" % outputs_left(w, out), r)

    def signal_to_rank(sig, rank):
        out = "o_rank_%d.npy" % rank
        proc = runner.start(big + ["--timeout", "600", "--iters", "200", "--out", out])
        pid = rank_pid(proc.tag, rank, timeout=HANG_LIMIT)
        time.sleep(1.0)
        os.kill(pid, sig)
        # Ended by the signal, not by the ranks' --timeout (600 s, past the limit) nor the 200 iterations.
        r = runner.finish(proc, limit=time.monotonic() - proc.t0 + HANG_LIMIT)
        expect(not r.leftovers, "processes left behind: %s" % r.leftovers, r)
        expect(r.code != 0 and "killed after" not in r.err, "expected a failure", r)
        expect(not outputs_left(w, out), "files left", r)

    def full_disk():
        # The file size limit applies to the ranks only (mpirun's own files would hit it too), and
        # the TCP transport keeps Open MPI's shared-memory files out of its way.
        r = runner.run(big + ["--timeout", "30", "--out", "o_full.npy", "--lse", "lse_full.npy"],
                       wrapper=["sh", "-c", 'ulimit -f 256 && exec "$0" "$@"'], mca=["--mca", "btl", "self,tcp"],
                       limit=HANG_LIMIT)
        expect_exit(r, 4, ["--out o_full.npy", "File too large"])
        left = outputs_left(w, "o_full.npy") + outputs_left(w, "lse_full.npy")
        expect(not left, "files left: %s" % left, r)

    def complete_outputs():
        r = runner.run(big + ["--out", "o_ok.npy", "--lse", "lse_ok.npy", "--check"], limit=HANG_LIMIT)
        expect_exit(r, 0)
        expect(outputs_left(w, "o_ok.npy") == ["o_ok.npy"] and outputs_left(w, "lse_ok.npy") == ["lse_ok.npy"],
               "outputs missing, or temporary files left", r)
        shape, _ = load(os.path.join(w, "lse_ok.npy"))
        expect(shape == (1, 4, 4096), "LSE shape %s" % (shape,), r)

    case("a rank stopped (SIGSTOP) mid-backward: exit 4 within --timeout, names rank and step", stopped_rank)
    case("a rank stopped (SIGSTOP) after a forward step: exit 4 within --timeout, names the rank", stopped_rank_forward)
    case("a rank killed (SIGKILL) mid-run: the job ends at once", killed_rank)
    case("a rank killed (SIGKILL) while writing: no output, no temporary file", killed_while_writing)
    case("SIGTERM to mpirun while writing: all end, no output, no temporary file",
         lambda: signal_to_mpirun_while_writing(signal.SIGTERM, "term"))
    case("SIGINT to mpirun while writing: all end, no output, no temporary file",
         lambda: signal_to_mpirun_while_writing(signal.SIGINT, "int"))
    case("SIGINT to a job of one process while writing: dies of SIGINT, says so, nothing left",
         lambda: signal_to_single_process_while_writing(signal.SIGINT))
    case("SIGTERM to a job of one process while writing: dies of SIGTERM, says so, nothing left",
         lambda: signal_to_single_process_while_writing(signal.SIGTERM))
    case("SIGTERM to rank 1 mid-run: the job ends", lambda: signal_to_rank(signal.SIGTERM, 1))
    case("SIGINT to rank 0 mid-run: the job ends", lambda: signal_to_rank(signal.SIGINT, 0))
    case("a full disk (ulimit -f): exit 4 naming the output, no file left", full_disk)
    case("a complete run: outputs at their final paths, no temporary file", complete_outputs)

    def one(c):
        c[1]()
        return c[0]

    # One at a time: a waiting rank polls MPI without pause (as MPI_Wait does), so jobs run side
    # by side starve each other, and a rank that is not scheduled in time after mpirun's SIGTERM
    # gets its SIGKILL before it can remove its temporary files.
    return run_cases(cases, one, 1)


def group_binding(runner, w, jobs):
    """README "Threads and binding": a rank that mpirun binds to one core and is asked for 2
    threads gets one warning naming the fix; unbound, or at the default --threads, none."""
    if len(os.sched_getaffinity(0)) < 2:
        print("# binding: skipped (this process may run on fewer than 2 cores)")
        return []
    small = ["--seq-len", "256", "--heads", "1", "--head-dim", "16"]
    fix = ["--threads 2 but rank 0 may run on only 1 core", "mpirun --map-by slot:PE=2 --bind-to core",
           "mpirun --bind-to none"]

    def run(binding, args, np=1):
        bound = Runner(runner.ringattn, runner.mpiexec, w)
        bound.flags = ["--bind-to", binding]
        r = bound.run(args, np=np, limit=HANG_LIMIT)
        expect(r.code == 0 and not r.leftovers, "expected success", r)
        return r, [l for l in ringattn_lines(r.err) if l.startswith("ringattn: warning:")]

    def warned(binding, args, np=1):
        r, warnings = run(binding, args, np)
        expect(len(warnings) == 1, "expected exactly one warning", r)
        for needle in fix:
            expect(needle in warnings[0], "the warning does not say %r" % needle, r)

    def not_warned(binding, args, np=1):
        r, warnings = run(binding, args, np)
        expect(not warnings, "expected no warning", r)
        return r

    def default_threads_within_the_binding():
        r = not_warned("core", small)
        expect("1 rank x 1 thread " in r.out, "the default --threads should be the 1 core the rank may run on", r)

    cases = [
        ("bound to one core, 2 threads: warned", lambda: warned("core", small + ["--threads", "2"])),
        ("two ranks bound, 2 threads: warned once", lambda: warned("core", small + ["--threads", "2"], np=2)),
        ("bench bound to one core, 2 threads: warned",
         lambda: warned("core", ["bench"] + small + ["--threads", "2", "--iters", "1", "--warmup", "0"])),
        ("unbound, 2 threads: not warned", lambda: not_warned("none", small + ["--threads", "2"])),
        ("bound, default threads: not warned", default_threads_within_the_binding),
    ]

    def one(case):
        name, fn = case
        fn()
        return name

    return run_cases(cases, one, jobs)


def run_groups(groups, prefix, run):
    """run(group, workdir) for each group, each in a temporary folder removed after it; returns the
    exit code (1 when a case failed)."""
    failures = []
    for group in groups:
        workdir = tempfile.mkdtemp(prefix="%s-%s-" % (prefix, group))
        try:
            t0 = time.monotonic()
            failures += run(group, workdir)
            print("# %s: %.1f s" % (group, time.monotonic() - t0), flush=True)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    if failures:
        print("%d failed: %s" % (len(failures), ", ".join(failures)))
        return 1
    return 0


GROUPS = {"bad_inputs": group_bad_inputs, "agreement": group_agreement, "numerics": group_numerics,
          "faults": group_faults, "binding": group_binding}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ringattn", required=True)
    parser.add_argument("--mpiexec", default="mpirun")
    parser.add_argument("--jobs", type=int, default=4, help="cases run at once (mpirun start-up is mostly waiting)")
    parser.add_argument("groups", nargs="+", choices=sorted(GROUPS))
    args = parser.parse_args()
    if os.geteuid() == 0:
        os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return run_groups(args.groups, "ringattn-cli", lambda group, workdir: GROUPS[group](
        Runner(os.path.abspath(args.ringattn), args.mpiexec, workdir), workdir, args.jobs))


if __name__ == "__main__":
    sys.exit(main())
