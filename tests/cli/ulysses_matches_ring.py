#!/usr/bin/env python3
"""`ringattn attention --ulysses U` end to end: at 4 ranks, U = 2 and 4 write the same O, LSE, dQ, dK,
dV files as --ulysses 1 (the plain ring) to fp32 rounding (causal zigzag with a window, GQA with
Hkv < U), and so does U = 2 with the ranks placed round-robin on two pretend nodes
(RINGATTN_TEST_NODES: groups {0, 2} and {1, 3}, --check passing), where U = 4 notes that its groups
span nodes; they report their all-to-all traffic in the JSON, and a U that does not divide P or H
is refused with exit 2 naming both values; `ringattn layer --demo --ulysses U` trains to the same
losses, round-robin included.
Usage: ulysses_matches_ring.py BUILD_DIR [MPIEXEC...]
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

BUILD = sys.argv[1]
MPIEXEC = sys.argv[2:] or ["mpirun"]
RANKS = 4
OUTPUTS = ["out", "lse", "dq", "dk", "dv"]


ROUND_ROBIN = {"RINGATTN_TEST_NODES": "0,1,0,1"}  # ranks 0, 2 on one pretend node, 1, 3 on the other


def run(tmp, extra, heads=8, kv_heads=2, env=None):
    cmd = MPIEXEC + ["-np", str(RANKS), os.path.join(BUILD, "ringattn"), "attention", "--seq-len", "301", "--heads",
                     str(heads), "--kv-heads", str(kv_heads), "--head-dim", "32", "--causal", "--window", "90,0", "--backward",
                     "--threads", "1", "--seed", "3"] + extra
    return subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=600, env=dict(os.environ, **(env or {})))


def main():
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        results = {}
        # (U, placement): "rr" is round-robin over two pretend nodes.
        for u, placement in ((1, ""), (2, ""), (4, ""), (2, "rr"), (4, "rr")):
            key = f"{u}{placement}"
            files = sum([["--" + name, f"{name}{key}.npy"] for name in OUTPUTS], [])
            extra = ["--check"] if placement else []
            r = run(tmp, ["--ulysses", str(u), "--json", f"s{key}.json"] + files + extra,
                    env=ROUND_ROBIN if placement else None)
            if r.returncode != 0:
                print(r.stdout, r.stderr)
                failures.append(f"--ulysses {u} {placement}: exit {r.returncode}")
                continue
            results[key] = {n: np.load(os.path.join(tmp, f"{n}{key}.npy")) for n in OUTPUTS}
            summary = json.load(open(os.path.join(tmp, f"s{key}.json")))
            if (summary["a2a_bytes_sent"] > 0) != (u > 1):
                failures.append(f"--ulysses {u}: a2a_bytes_sent {summary['a2a_bytes_sent']}")
            # Round-robin: U = 2 fits the nodes (groups {0, 2}, {1, 3}); U = 4 does not, and says so once.
            notes = r.stderr.count("groups are consecutive ranks and some span nodes")
            if notes != (1 if key == "4rr" else 0):
                failures.append(f"--ulysses {u} {placement}: {notes} notes about groups spanning nodes: {r.stderr[:300]!r}")
        for key in ("2", "4", "2rr", "4rr"):
            if key not in results or "1" not in results:
                continue
            for n in OUTPUTS:
                a, b = results[key][n], results["1"][n]
                err = float(np.abs(a - b).max())
                if not err <= 1e-5 * max(1.0, float(np.abs(b).max())):
                    failures.append(f"--ulysses {key}: {n} differs from --ulysses 1 by {err}")
        for u, heads, words in ((3, 8, ["--ulysses 3", "4 ranks"]), (4, 6, ["--ulysses 4", "--heads 6"])):
            r = run(tmp, ["--ulysses", str(u)], heads, heads)
            if r.returncode != 2 or not all(w in r.stderr for w in words):
                failures.append(f"--ulysses {u} --heads {heads}: exit {r.returncode}, stderr {r.stderr[:300]!r}")
        # The layer: a few demo training steps give the same loss curve whatever U.
        losses = {}
        for u in (1, 2, 4, "2rr"):
            cmd = MPIEXEC + ["-np", str(RANKS), os.path.join(BUILD, "ringattn"), "layer", "--demo", "--causal",
                             "--steps", "4", "--threads", "1", "--ulysses", str(u)[0]]
            r = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=600,
                               env=dict(os.environ, **(ROUND_ROBIN if u == "2rr" else {})))
            line = [l for l in r.stdout.splitlines() if l.strip().startswith("loss ")]
            if r.returncode != 0 or not line:
                failures.append(f"layer --ulysses {u}: exit {r.returncode}, {r.stderr[:300]!r}")
                continue
            words = line[0].split()
            losses[u] = (float(words[1]), float(words[3]))
        for u in (2, 4, "2rr"):
            if u in losses and 1 in losses:
                for a, b in zip(losses[u], losses[1]):
                    if abs(a - b) > 1e-4 * abs(b):
                        failures.append(f"layer --ulysses {u}: loss {losses[u]} differs from --ulysses 1 {losses[1]}")
    for f in failures:
        print("FAIL", f)
    print("ok" if not failures else f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
