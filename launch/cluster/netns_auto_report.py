"""The table of launch/cluster/netns_auto.sh: per link rate and node count, the configuration
--auto chose, its measured time (in the sweep and in --auto's own run) against the fastest
configuration the sweep measured, and the model's predicted time of both.

  python3 netns_auto_report.py OUT_DIR [--check 0.10]   (exit 1 when a choice misses by more)
"""
import glob
import json
import os
import sys


def total(j):
    return j["forward_s"] + j.get("backward_s", 0.0)


def key(j):
    return (j["layout"], j["schedule"], j.get("ulysses", 1))


def main():
    out = sys.argv[1]
    limit = float(sys.argv[sys.argv.index("--check") + 1]) if "--check" in sys.argv else None
    rows, worst = [], 0.0
    for auto_path in sorted(glob.glob(os.path.join(out, "*-auto.json"))):
        rate, nodes = os.path.basename(auto_path).split("-")[:2]
        auto = json.load(open(auto_path))
        sweep = {}
        for path in glob.glob(os.path.join(out, "%s-%s-*-*-*.json" % (rate, nodes))):
            if path.endswith("-auto.json"):
                continue
            j = json.load(open(path))
            sweep[key(j)] = total(j)
        best = min(sweep, key=sweep.get)
        chosen = key(auto)
        predicted = {(c["layout"], c["schedule"], c["ulysses"]): c["total_s"] for c in auto["auto"]["candidates"]}
        tried = sum(c.get("measured_s") is not None for c in auto["auto"]["candidates"])
        in_sweep = sweep.get(chosen, total(auto))
        miss = in_sweep / sweep[best] - 1
        worst = max(worst, miss)
        rows.append("| %s | %s | %s/%s/U=%d | %.3f (own run %.3f) | %s/%s/U=%d | %.3f | %+.1f%% | %.3f / %.3f | %d |" % (
            rate, nodes, chosen[0], chosen[1], chosen[2], in_sweep, total(auto), best[0], best[1], best[2],
            sweep[best], 100 * miss, predicted.get(chosen, float("nan")), predicted.get(best, float("nan")), tried))
    print("| link | nodes | --auto chose | its time (s) | fastest measured | its time (s) | chose vs fastest |"
          " predicted (s): chosen / fastest | candidates tried |")
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    if limit is not None and worst > limit:
        print("a choice ran %.1f%% slower than the fastest (limit %.0f%%)" % (100 * worst, 100 * limit))
        sys.exit(1)


main()
