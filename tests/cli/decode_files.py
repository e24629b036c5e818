#!/usr/bin/env python3
"""`ringattn decode --q --k --v`: the prompt from .npy files (the attention job's layout).

Good files (3-D and 4-D, float32 and float64, fp32 and bf16, prefill by the rule, chunked, or the
cache filled without prefill) pass --check at 1 to 3 ranks; the check sees the files' values (a
large value in V raises the O error the check measures). Bad files (missing, a wrong rank of
array, K and V that differ, Q and K that disagree, shape flags that disagree with the files, one
file of three) exit 2 on every rank, within a timeout (no rank waits), with one message naming
the option. Usage: decode_files.py BUILD_DIR [MPIEXEC...]
"""
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

BUILD = sys.argv[1]
MPIEXEC = sys.argv[2:] or ["mpirun"]


def run(np_, args):
    cmd = MPIEXEC + ["-np", str(np_), os.path.join(BUILD, "ringattn"), "decode", "--threads", "1"] + args
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    return p.returncode, p.stdout + p.stderr


def o_error(out):
    m = re.search(r"O error ([0-9.e+-]+)", out)
    assert m, out
    return float(m.group(1))


def main():
    failures = []
    rng = np.random.default_rng(7)
    with tempfile.TemporaryDirectory() as d:
        def save(name, a):
            path = os.path.join(d, name)
            np.save(path, a)
            return path

        q = save("q.npy", rng.standard_normal((700, 4, 32)).astype(np.float32))
        k = save("k.npy", rng.standard_normal((700, 2, 32)).astype(np.float32))
        v_array = rng.standard_normal((700, 2, 32)).astype(np.float32)
        v = save("v.npy", v_array)
        big = v_array.copy()
        big[5, 0, 3] = 1000.0
        v_big = save("v_big.npy", big)
        q4 = save("q4.npy", rng.standard_normal((2, 500, 4, 32)))  # float64: converted
        k4 = save("k4.npy", rng.standard_normal((2, 500, 2, 32)).astype(np.float32))
        v4 = save("v4.npy", rng.standard_normal((2, 500, 2, 32)).astype(np.float32))
        flat = save("flat.npy", np.zeros((700, 128), np.float32))
        files = ["--q", q, "--k", k, "--v", v]

        good = [
            (1, files + ["--new-tokens", "3"]),
            (2, files + ["--new-tokens", "3", "--heads", "4", "--seq-len", "700"]),  # flags restating the files
            (3, ["--q", q4, "--k", k4, "--v", v4, "--new-tokens", "2", "--dtype", "bf16", "--prefill-chunk", "200"]),
            (2, files + ["--new-tokens", "2", "--prefill-method", "none"]),
        ]
        errors = {}
        for np_, args in good:
            code, out = run(np_, args + ["--check"])
            if code != 0 or "check     passed" not in out:
                failures.append("good files %s at %d ranks: exit %d\n%s" % (args, np_, code, out))
            elif np_ == 2 and "--prefill-method" not in args:
                errors["v"] = o_error(out)
        code, out = run(2, ["--q", q, "--k", k, "--v", v_big, "--new-tokens", "3", "--heads", "4", "--seq-len", "700",
                            "--check"])
        if code != 0 or "v" not in errors or not o_error(out) > 3 * errors["v"]:
            failures.append("a large value in --v did not reach the check (exit %d, O errors %s and %s)\n%s" %
                            (code, errors.get("v"), o_error(out) if code == 0 else None, out))

        bad = [
            (["--q", q, "--k", os.path.join(d, "missing.npy"), "--v", v], "--k"),
            (["--q", flat, "--k", k, "--v", v], "--q"),
            (["--q", q, "--k", k, "--v", q], "--v"),
            (["--q", q, "--k", k4, "--v", v4], "--k"),
            (files + ["--heads", "8"], "--heads"),
            (files + ["--kv-heads", "4"], "--kv-heads"),
            (files + ["--seq-len", "100"], "--seq-len"),
            (files + ["--head-dim", "64"], "--head-dim"),
            (["--q", q4, "--k", k4, "--v", v4, "--batch", "1"], "--batch"),
            (["--q", q], "--k"),
        ]
        for np_ in (1, 2):
            for args, option in bad:
                try:
                    code, out = run(np_, args)
                except subprocess.TimeoutExpired:
                    failures.append("%s at %d ranks: a rank hung" % (args, np_))
                    continue
                lines = [l for l in out.splitlines() if l.startswith("ringattn: error:")]
                if code != 2 or len(lines) != 1 or option not in lines[0]:
                    failures.append("%s at %d ranks: exit %d, expected 2 and one message naming %s\n%s" %
                                    (args, np_, code, option, out))
    for f in failures:
        print("FAILED:", f)
    print("%d failures" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
