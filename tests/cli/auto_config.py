"""`ringattn --auto` and `ringattn bench --auto` end to end (docs/benchmarks.md, "Choosing the configuration:
--auto"): the job runs the configuration it printed as chosen: the fastest predicted of its candidates, or, where
the model put several within its margin and tried them, the fastest measured of those (unless within the
hysteresis of the model's own choice); it checks itself; what the command line fixes stays fixed; a calibration
file replaces the start-up measurement, and with --auto-budget 0 nothing is tried; bad uses exit 2 naming the
option.

  python3 auto_config.py BUILD_DIR MPIEXEC [MPIEXEC_FLAGS...]
"""
import json
import os
import subprocess
import sys
import tempfile

BUILD, MPIEXEC, FLAGS = sys.argv[1], sys.argv[2], sys.argv[3:]
EXE = os.path.join(BUILD, "ringattn")
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
JOB = ["--causal", "--seq-len", "3072", "--heads", "4", "--head-dim", "32", "--backward", "--check", "--threads", "1"]
tmp = tempfile.mkdtemp()


def run(np, args, expect=0):
    p = subprocess.run([MPIEXEC] + FLAGS + ["-np", str(np), "--oversubscribe", EXE] + args, env=ENV,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == expect, "exit %d (expected %d) for %s:\n%s\n%s" % (p.returncode, expect, args, p.stdout,
                                                                              p.stderr)
    return p


def auto_run(np, extra, name):
    path = os.path.join(tmp, name + ".json")
    p = run(np, JOB + ["--auto", "--json", path] + extra)
    j = json.load(open(path))
    a = j["auto"]
    chosen = a["candidates"][a["chosen"]]
    # It ran what it chose, and printed why.
    assert (j["layout"], j["schedule"], j["ulysses"]) == (chosen["layout"], chosen["schedule"], chosen["ulysses"]), j
    assert "chose --layout %s --schedule %s --ulysses %d" % (chosen["layout"], chosen["schedule"],
                                                             chosen["ulysses"]) in p.stdout, p.stdout
    check_choice(a)
    assert j["check_passed"], j
    return j, p


def check_choice(a):
    cands, chosen, trials = a["candidates"], a["candidates"][a["chosen"]], a["trials"]
    tried = [c for c in cands if c["measured_s"] is not None]
    if trials["pass"] is None:
        assert not tried and chosen["total_s"] <= min(c["total_s"] for c in cands) * 1.005, a
        return
    # Tried: only candidates within the margin of the model's best, the model's best among them.
    best = min(c["total_s"] for c in cands)
    assert len(tried) >= 2 and all(c["total_s"] <= best * (1 + trials["margin"]) * 1.005 for c in tried), a
    model = [c for c in tried if c["total_s"] <= best * 1.005]
    assert model, a
    fastest = min(c["measured_s"] for c in tried)
    assert chosen["measured_s"] is not None, a
    assert chosen["measured_s"] == fastest or chosen in model, a


# Measured at start-up, 3 ranks: every layout x schedule x U in {1, 3}... (4 heads: U = 1 only, or 2 at 4 ranks).
j, _ = auto_run(3, [], "measured")
assert j["auto"]["source"].startswith("measured at start-up"), j["auto"]["source"]
assert len(j["auto"]["candidates"]) == 6, j["auto"]["candidates"]
j, _ = auto_run(4, [], "measured4")
assert {c["ulysses"] for c in j["auto"]["candidates"]} == {1, 2, 4}, j["auto"]["candidates"]

# What the command line fixed stays.
j, _ = auto_run(2, ["--layout", "striped", "--schedule", "ring"], "fixed")
assert all(c["layout"] == "striped" and c["schedule"] == "ring" for c in j["auto"]["candidates"]), j["auto"]
assert (j["layout"], j["schedule"]) == ("striped", "ring")

# A calibration file: no measurement; a slow network between nodes that are all one node here.
cal = os.path.join(tmp, "machine.json")
json.dump({"name": "test", "forward_gflops": 50, "backward_gflops": 40, "intra_bandwidth_gbps": 0.01,
           "intra_latency_us": 100}, open(cal, "w"))
j, p = auto_run(2, ["--calibration", cal], "file")
assert j["auto"]["source"] == "--calibration " + cal, j["auto"]["source"]
assert "measured at start-up" not in p.stdout

# The model alone: a calibration file and no time to try anything.
j, p = auto_run(2, ["--calibration", cal, "--auto-budget", "0"], "model")
assert j["auto"]["trials"]["pass"] is None and "no trials" in p.stdout, (j["auto"]["trials"], p.stdout)

# Trials: a machine on which every candidate is predicted alike (no links, no costs) leaves them all
# within the margin; they are tried, and the choice is one of them, by the rule above.
flat = os.path.join(tmp, "flat.json")
json.dump({"name": "flat", "forward_gflops": 50, "backward_gflops": 40}, open(flat, "w"))
j, p = auto_run(4, ["--calibration", flat, "--auto-budget", "20"], "trials")
assert j["auto"]["trials"]["pass"] is not None and "tried the" in p.stdout, (j["auto"]["trials"], p.stdout)
assert len({c["ulysses"] for c in j["auto"]["candidates"] if c["measured_s"] is not None}) >= 2, j["auto"]

# bench --auto: each point's configuration chosen for its ranks, and reported per point.
path = os.path.join(tmp, "bench.json")
p = run(4, ["bench", "--auto", "--causal", "--seq-len", "2048", "--heads", "4", "--head-dim", "32", "--threads", "1",
            "--ranks", "2,4", "--iters", "1", "--warmup", "0", "--json", path])
b = json.load(open(path))
assert b["config"]["layout"] == "auto" and len(b["points"]) == 2, b["config"]
for pt in b["points"]:
    a = pt["auto"]
    chosen = a["candidates"][a["chosen"]]
    assert (pt["layout"], pt["schedule"], pt["ulysses"]) == (chosen["layout"], chosen["schedule"], chosen["ulysses"])
    check_choice(a)
    assert pt["check_passed"], pt
assert p.stdout.count("chose --layout") == 2, p.stdout

# Bad uses: exit 2, naming the option, from every rank's point of view (one message, no hang).
for args, words in [(["--calibration", cal], "--calibration"), (["--auto-budget", "3"], "--auto-budget"),
                    (["--auto", "--calibration", os.path.join(tmp, "missing.json")], "--calibration"),
                    (["--auto", "--auto-budget", "0"], "--auto-budget"),
                    (["--auto", "--calibration", cal, "--auto-budget", "-1"], "--auto-budget")]:
    p = run(2, JOB + args, expect=2)
    assert words in p.stderr, (args, p.stderr)
bad = os.path.join(tmp, "bad.json")
json.dump({"name": "no rates"}, open(bad, "w"))
p = run(2, JOB + ["--auto", "--calibration", bad], expect=2)
assert "forward_gflops" in p.stderr, p.stderr
p = run(2, ["bench", "--auto-budget", "3"], expect=2)
assert "--auto-budget" in p.stderr, p.stderr
print("auto_config: all passed")
