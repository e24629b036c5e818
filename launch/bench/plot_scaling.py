#!/usr/bin/env python3
"""Plots `ringattn bench --json` results as a PNG.

Scaling runs: left, scaling efficiency against ranks (log2 axis) with the ideal line, one line
per file; right, where the time of each point went (first file): kernel compute, exposed
communication (time blocked waiting for K/V or gradients) and the rest (host copies, set-up,
imbalance), forward and, when measured, backward; times are means over ranks, the marker is the
slowest rank.

Link sweeps (one point per file, each with another --emulate-bandwidth): left, the exposed
fraction of the forward pass against the link's bandwidth, with the block condition (a step's
transfer as long as its compute) and, given `--plan` (a `ringattn plan --calibrate ... --json`
file), the model's prediction; right, the time split of each file's point.

    python3 launch/bench/plot_scaling.py strong.json [weak.json ...] -o scaling.png
    python3 launch/bench/plot_scaling.py emulated_*.json --plan plan.json -o emulated.png

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


def plot_efficiency(ax, runs, matplotlib):
    max_ranks = 1
    for _, config, points in runs:
        ranks = [p["ranks"] for p in points]
        eff = [100.0 * p.get("efficiency", 0.0) for p in points]
        max_ranks = max(max_ranks, max(ranks))
        ax.plot(ranks, eff, marker="o", label=label_of(config))
        for r, e, p in zip(ranks, eff, points):
            if p.get("wrong"):
                ax.annotate("WRONG", (r, e), color="red")
    ax.axhline(100.0, color="gray", linestyle="--", label="ideal")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("ranks")
    ax.set_ylabel("efficiency (%)")
    ax.set_ylim(0, 110)
    ax.set_xticks([2 ** k for k in range(0, max_ranks.bit_length())])
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_title("scaling efficiency (forward + backward when run)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)


def plot_split(ax, config, points, names, matplotlib):
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
        ax.bar(xs, compute, width, color=colors["compute"], hatch=hatch, label="compute" if i == 0 else None)
        ax.bar(xs, wait, width, bottom=compute, color=colors["exposed communication"], hatch=hatch,
               label="exposed communication" if i == 0 else None)
        ax.bar(xs, other, width, bottom=[a + b for a, b in zip(compute, wait)], color=colors["other"],
               hatch=hatch, label="other" if i == 0 else None)
        ax.plot(xs, wall, "k_", markersize=14, label="slowest rank" if i == 0 else None)
    ax.set_xticks(range(len(points)))
    ax.set_xticklabels(names)
    ax.set_xlabel("ranks (plain: forward, hatched: backward)" if len(passes) > 1 else "ranks")
    ax.set_ylabel("time per pass (ms)")
    ax.set_title("time split")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)


def plot_link_sweep(ax, runs, plan_path):
    gbps = [c["emulate_bandwidth_gbps"] for _, c, _ in runs]
    exposed = [100.0 * points[0].get("exposed_comm_fraction", 0.0) for _, _, points in runs]
    ax.plot(gbps, exposed, "o", label="measured (forward)")
    # Block condition: one step's K/V take as long to travel as the step computes.
    p = runs[0][2][0]
    steps = max(1, p["ranks"])
    step_bytes = p["comm_bytes_sent"] / max(1, p["ranks"] * (p["ranks"] - 1))
    step_compute = p["forward_compute_s"] / steps
    if step_bytes > 0 and step_compute > 0:
        ax.axvline(step_bytes / step_compute / 1e9, color="gray", linestyle="--",
                   label="block condition: transfer = compute")
    if plan_path:
        with open(plan_path) as f:
            plan = json.load(f)
        rows = [r for r in plan.get("calibration", {}).get("points", []) if r.get("emulated")]
        rows.sort(key=lambda r: r["link_gbps"])
        if rows:
            ax.plot([r["link_gbps"] for r in rows], [100.0 * r["predicted_exposed_comm_fraction"] for r in rows],
                    "-", color="black", label="model (calibrated)")
    ax.set_xscale("log")
    ax.set_xlabel("emulated link bandwidth (GB/s)")
    ax.set_ylabel("exposed communication (% of forward)")
    ax.set_ylim(0, 100)
    ax.set_title("exposed communication against link bandwidth")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", help="ringattn bench --json files")
    parser.add_argument("-o", "--output", default="scaling.png", help="PNG to write (default scaling.png)")
    parser.add_argument("--title", default=None, help="figure title")
    parser.add_argument("--plan", default=None, help="ringattn plan --calibrate --json output: predictions to overlay")
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

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    link_sweep = len(runs) > 1 and all(len(points) == 1 for _, _, points in runs) and \
        len({c.get("emulate_bandwidth_gbps") for _, c, _ in runs}) == len(runs)
    if link_sweep:
        plot_link_sweep(left, runs, args.plan)
        runs = sorted(runs, key=lambda r: -r[1].get("emulate_bandwidth_gbps", 0.0))
        names = ["%g GB/s" % c.get("emulate_bandwidth_gbps", 0.0) for _, c, _ in runs]
        plot_split(right, runs[0][1], [p for _, _, points in runs for p in points], names, matplotlib)
        right.set_xlabel("emulated link (plain: forward, hatched: backward)")
    else:
        plot_efficiency(left, runs, matplotlib)
        _, config, points = runs[0]
        plot_split(right, config, points, ["%d\n(L=%d)" % (p["ranks"], p["seq_len"]) for p in points], matplotlib)
        right.set_title("time split: " + label_of(config))
    config = runs[0][1]

    fig.suptitle(args.title or "ringattn bench: %s, %s" % (config.get("host", ""), config.get("cpu", "")))
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print("wrote", args.output)


if __name__ == "__main__":
    main()
