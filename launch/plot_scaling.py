#!/usr/bin/env python3
"""Plots `ringattn bench --json` results as a PNG.

Left: scaling efficiency against ranks (log2 axis) with the ideal line, one line per file.
Right: where the time of each point went (first file): kernel compute, exposed communication
(time blocked waiting for K/V or gradients) and the rest (host copies, set-up, imbalance), forward
and, when measured, backward; times are means over ranks, the marker is the slowest rank.

    python3 launch/plot_scaling.py strong.json [weak.json ...] -o scaling.png

Needs matplotlib (Debian: python3-matplotlib, installed by launch/setup.sh).
"""
import argparse
import json
import os
import sys


def label_of(config):
    parts = [config.get("mode", "?"), config.get("mask", ""), config.get("layout", ""), config.get("schedule", "")]
    if config.get("emulate_bandwidth_gbps") or config.get("emulate_latency_us"):
        parts.append("link %g GB/s %g us" % (config.get("emulate_bandwidth_gbps", 0), config.get("emulate_latency_us", 0)))
    return " ".join(p for p in parts if p)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", help="ringattn bench --json files")
    parser.add_argument("-o", "--output", default="scaling.png", help="PNG to write (default scaling.png)")
    parser.add_argument("--title", default=None, help="figure title")
    args = parser.parse_args()

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        # Debian's matplotlib lives with the system Python, which another python3 on PATH may hide.
        system = "/usr/bin/python3"
        if os.path.exists(system) and os.path.realpath(sys.executable) != os.path.realpath(system):
            os.execv(system, [system] + sys.argv)
        sys.exit("plot_scaling.py: matplotlib is missing (apt-get install python3-matplotlib)")

    runs = []
    for path in args.files:
        with open(path) as f:
            doc = json.load(f)
        if "config" not in doc or "points" not in doc:
            sys.exit("plot_scaling.py: %s is not a ringattn bench --json file" % path)
        runs.append((path, doc["config"], doc["points"]))

    fig, (eff_ax, split_ax) = plt.subplots(1, 2, figsize=(13, 5))
    max_ranks = 1
    for path, config, points in runs:
        ranks = [p["ranks"] for p in points]
        eff = [100.0 * p.get("efficiency", 0.0) for p in points]
        max_ranks = max(max_ranks, max(ranks))
        eff_ax.plot(ranks, eff, marker="o", label=label_of(config))
        for r, e, p in zip(ranks, eff, points):
            if p.get("wrong"):
                eff_ax.annotate("WRONG", (r, e), color="red")
    eff_ax.axhline(100.0, color="gray", linestyle="--", label="ideal")
    eff_ax.set_xscale("log", base=2)
    eff_ax.set_xlabel("ranks")
    eff_ax.set_ylabel("efficiency (%)")
    eff_ax.set_ylim(0, 110)
    eff_ax.set_xticks([2 ** k for k in range(0, max_ranks.bit_length())])
    eff_ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    eff_ax.set_title("scaling efficiency (forward + backward when run)")
    eff_ax.grid(True, alpha=0.3)
    eff_ax.legend(fontsize=8)

    _, config, points = runs[0]
    passes = ["forward"] + (["backward"] if config.get("backward") else [])
    width = 0.8 / len(passes)
    colors = {"compute": "#4c72b0", "exposed communication": "#dd8452", "other": "#a0a0a0"}
    for i, name in enumerate(passes):
        xs, compute, wait, other, wall = [], [], [], [], []
        for k, p in enumerate(points):
            mean = p.get(name + "_mean_s") or p.get(name + "_s") or 0.0
            c = p.get(name + "_compute_s") or 0.0
            w = p.get(name + "_wait_s") or 0.0
            xs.append(k + (i - (len(passes) - 1) / 2) * width)
            compute.append(1e3 * c)
            wait.append(1e3 * w)
            other.append(1e3 * max(0.0, mean - c - w))
            wall.append(1e3 * (p.get(name + "_s") or 0.0))
        hatch = None if name == "forward" else "//"
        split_ax.bar(xs, compute, width, color=colors["compute"], hatch=hatch,
                     label="compute" if i == 0 else None)
        split_ax.bar(xs, wait, width, bottom=compute, color=colors["exposed communication"], hatch=hatch,
                     label="exposed communication" if i == 0 else None)
        split_ax.bar(xs, other, width, bottom=[a + b for a, b in zip(compute, wait)], color=colors["other"],
                     hatch=hatch, label="other" if i == 0 else None)
        split_ax.plot(xs, wall, "k_", markersize=14, label="slowest rank" if i == 0 else None)
    split_ax.set_xticks(range(len(points)))
    split_ax.set_xticklabels(["%d\n(L=%d)" % (p["ranks"], p["seq_len"]) for p in points])
    split_ax.set_xlabel("ranks (plain: forward, hatched: backward)" if len(passes) > 1 else "ranks")
    split_ax.set_ylabel("time per pass (ms)")
    split_ax.set_title("time split: " + label_of(config))
    split_ax.legend(fontsize=8)
    split_ax.grid(True, axis="y", alpha=0.3)

    fig.suptitle(args.title or "ringattn bench: %s, %s" % (config.get("host", ""), config.get("cpu", "")))
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print("wrote", args.output)


if __name__ == "__main__":
    main()
