#!/usr/bin/env python3
"""Merges `ringattn bench --json` files of one sweep (one launch per node count) into one.

Points are sorted by rank count (a count measured in several files: the last file wins) and
their efficiency is recomputed relative to the smallest point, as `ringattn bench` computes it
within one launch: per-rank throughput, (FLOPs / (ranks * time)) / (base FLOPs / (base ranks *
base time)), on forward + backward (FLOPs 3.5x forward) when the backward was run.

    python3 launch/cluster/merge_bench.py sweep/bench_*nodes.json -o sweep/bench_sweep.json
"""
import argparse
import json
import sys

# Configuration keys that must agree for points to belong to one sweep.
SAME = ["mode", "seq_len", "tokens_per_rank", "batch", "heads", "kv_heads", "head_dim", "mask", "layout",
        "schedule", "dtype", "backward", "emulate_bandwidth_gbps", "emulate_latency_us"]


def efficiency(point, base, passes):
    """Per-rank throughput of the passes (names of time keys) relative to the base point."""
    def per_rank(p):
        flops = p["flops_forward"] * sum(2.5 if name == "backward_s" else 1.0 for name in passes)
        seconds = sum(p.get(name) or 0.0 for name in passes)
        return flops / (p["ranks"] * seconds) if seconds > 0 else 0.0
    b = per_rank(base)
    return per_rank(point) / b if b > 0 else 0.0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+")
    parser.add_argument("-o", "--output", required=True)
    args = parser.parse_args()

    config, by_ranks = None, {}
    for path in args.files:
        with open(path) as f:
            doc = json.load(f)
        if config is None:
            config = dict(doc["config"])
        else:
            for key in SAME:
                if doc["config"].get(key) != config.get(key):
                    sys.exit("merge_bench.py: %s has %s = %r, the first file %r: not one sweep"
                             % (path, key, doc["config"].get(key), config.get(key)))
            config["nodes"] = max(config.get("nodes", 1), doc["config"].get("nodes", 1))
            config["job_ranks"] = max(config.get("job_ranks", 1), doc["config"].get("job_ranks", 1))
        for p in doc["points"]:
            by_ranks[p["ranks"]] = p

    points = [by_ranks[r] for r in sorted(by_ranks)]
    base = points[0]
    for p in points:
        p["efficiency_forward"] = efficiency(p, base, ["forward_s"])
        if config.get("backward"):
            p["efficiency_backward"] = efficiency(p, base, ["backward_s"])
            p["efficiency"] = efficiency(p, base, ["forward_s", "backward_s"])
        else:
            p["efficiency"] = p["efficiency_forward"]
    config["ranks"] = [p["ranks"] for p in points]
    config["efficiency_base_ranks"] = base["ranks"]
    config["merged_from"] = args.files
    with open(args.output, "w") as f:
        json.dump({"config": config, "points": points}, f, indent=2)
        f.write("\n")
    print("merge_bench.py: %d points from %d files -> %s" % (len(points), len(args.files), args.output))
    for p in points:
        print("  %6d ranks  %10.4f s forward  %s  efficiency %5.1f%%" % (
            p["ranks"], p["forward_s"],
            "%10.4f s backward" % p["backward_s"] if p.get("backward_s") else "",
            100 * p["efficiency"]))


if __name__ == "__main__":
    main()
