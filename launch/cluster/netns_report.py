#!/usr/bin/env python3
"""The table and the plot of launch/cluster/netns_sweep.sh (the cluster in a box).

    python3 launch/cluster/netns_report.py OUT -o OUT/netns_scaling.png

Reads OUT/RATE-SERIES-NODES.json (ringattn bench --json, one point each), .wire.json (bytes the
nodes sent on their data links during a forward pass alone) with its .bytes.json (that pass's
JSON), and OUT/RATE-plan.json (ringattn plan --calibrate ... --same-run --json). Prints a Markdown
table; draws the same-run efficiency and the exposed communication against nodes, measured and
predicted.

Same-run efficiency: the nodes share this machine's cores, so a rank computes slower the more
ranks there are, and time-based efficiency measures the sharing, not the network. What the
network costs is the time ranks spend waiting: efficiency = (time not blocked waiting, mean over
ranks) / (the slowest rank's time), forward + backward, relative to the series' first point. With
each run's own kernel rate this is T1 P1 / (P TP) of a machine whose ranks all compute at one rate.
The plan's prediction is put the same way: the run's busy time over the predicted time.
"""
import argparse
import glob
import json
import os
import re
import sys

SERIES = ["weak", "strong", "hybrid"]
MIB = 1024.0 * 1024.0


def load(path):
    with open(path) as f:
        return json.load(f)


def busy(p):
    b = (p["forward_mean_s"] - p["forward_wait_s"])
    if p.get("backward_s"):
        b += p["backward_mean_s"] - p["backward_wait_s"]
    return b


def wall(p, fwd=None, bwd=None):
    return (p["forward_s"] if fwd is None else fwd) + ((p.get("backward_s") or 0.0) if bwd is None else bwd)


def collect(out):
    rows = []
    for path in glob.glob(os.path.join(out, "*.json")):
        m = re.fullmatch(r"(.+)-(%s)-(\d+)\.json" % "|".join(SERIES), os.path.basename(path))
        if not m:
            continue
        rate, series, nodes = m.group(1), m.group(2), int(m.group(3))
        doc = load(path)
        point = doc["points"][0]
        row = {"rate": rate, "series": series, "nodes": nodes, "point": point, "path": path, "config": doc["config"]}
        wire = path[:-5] + ".wire.json"
        if os.path.exists(wire):
            row["wire"] = load(wire)["wire_bytes"]
            row["wire_json"] = load(path[:-5] + ".bytes.json")["points"][0]["comm_bytes_sent"]
        rows.append(row)
    plans = {}
    for path in glob.glob(os.path.join(out, "*-plan.json")):
        for c in load(path)["calibration"]["points"]:
            plans[os.path.abspath(c["point"].rsplit("#", 1)[0])] = c
    for row in rows:
        row["plan"] = plans.get(os.path.abspath(row["path"]))
    rate_key = lambda r: -float(re.sub(r"[^0-9.]", "", r) or 0) * (1000 if "g" in r else 1)
    rows.sort(key=lambda r: (rate_key(r["rate"]), SERIES.index(r["series"]), r["nodes"]))
    for row in rows:
        base = next(b for b in rows if b["rate"] == row["rate"] and b["series"] == row["series"])
        p, bp = row["point"], base["point"]
        row["efficiency"] = (busy(p) / wall(p)) / (busy(bp) / wall(bp))
        if row["plan"] and base["plan"]:
            pr, bpr = row["plan"], base["plan"]
            pred = busy(p) / wall(p, pr["predicted_forward_s"], pr.get("predicted_backward_s", 0.0))
            bpred = busy(bp) / wall(bp, bpr["predicted_forward_s"], bpr.get("predicted_backward_s", 0.0))
            row["predicted_efficiency"] = pred / bpred
    return rows


def table(rows):
    print("| link | series | nodes | ranks | seq_len | forward ms (plan, error) | backward ms (plan, error) "
          "| efficiency (plan) | exposed fwd / bwd (plan fwd) | MiB sent per rank: wire / JSON |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    worst = 0.0
    for r in rows:
        p, pr = r["point"], r["plan"]
        series = r["series"] + (" (U=2)" if r["series"] == "hybrid" else "")

        def timed(measured, predicted, error):
            return "%.0f (%.0f, %+.0f%%)" % (1e3 * measured, 1e3 * predicted, 100 * error) if pr else "%.0f" % (
                1e3 * measured)

        fwd = timed(p["forward_s"], pr and pr["predicted_forward_s"], pr and pr["forward_error"])
        bwd = timed(p["backward_s"], pr and pr.get("predicted_backward_s"), pr and pr.get("backward_error"))
        if pr:
            worst = max(worst, abs(pr["forward_error"]), abs(pr.get("backward_error", 0.0)))
        eff = "%.0f%%" % (100 * r["efficiency"])
        if "predicted_efficiency" in r:
            eff += " (%.0f%%)" % (100 * r["predicted_efficiency"])
        exposed = "%.0f%% / %.0f%%" % (100 * p["exposed_comm_fraction"], 100 * (p.get("exposed_comm_fraction_backward") or 0))
        if pr:
            exposed += " (%.0f%%)" % (100 * pr["predicted_exposed_comm_fraction"])
        wire = "-"
        if "wire" in r and p["ranks"] > 1:
            wire = "%.2f / %.2f" % (r["wire"] / p["ranks"] / MIB, r["wire_json"] / p["ranks"] / MIB)
        print("| %s | %s | %d | %d | %d | %s | %s | %s | %s | %s |" % (
            r["rate"], series, r["nodes"], p["ranks"], p["seq_len"], fwd, bwd, eff, exposed, wire))
    print("\nlargest plan error: %.1f%% over %d points" % (100 * worst, sum(1 for r in rows if r["plan"])))


def plot(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("netns_report.py: matplotlib not found: no plot", file=sys.stderr)
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = {"weak": "#4c72b0", "strong": "#dd8452", "hybrid": "#55a868"}
    rates = []
    for r in rows:
        if r["rate"] not in rates:
            rates.append(r["rate"])
    styles = ["-", "--", ":"]
    for k, rate in enumerate(rates):
        for series in SERIES:
            pts = [r for r in rows if r["rate"] == rate and r["series"] == series]
            if not pts:
                continue
            n = [r["nodes"] for r in pts]
            label = "%s %s" % (series + (" (U=2)" if series == "hybrid" else ""), rate)
            left.plot(n, [100 * r["efficiency"] for r in pts], styles[k % 3], marker="o", color=colors[series],
                      label=label)
            pred = [(r["nodes"], 100 * r["predicted_efficiency"]) for r in pts if "predicted_efficiency" in r]
            if pred:
                left.plot(*zip(*pred), "x", color=colors[series], markersize=8)
            right.plot(n, [100 * r["point"]["exposed_comm_fraction"] for r in pts], styles[k % 3], marker="o",
                       color=colors[series], label=label)
            pred = [(r["nodes"], 100 * r["plan"]["predicted_exposed_comm_fraction"]) for r in pts if r["plan"]]
            if pred:
                right.plot(*zip(*pred), "x", color=colors[series], markersize=8)
    for ax, title, ylabel in ((left, "same-run efficiency (forward + backward)", "efficiency (%)"),
                              (right, "exposed communication (forward)", "time waiting for data (%)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({r["nodes"] for r in rows}))
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.set_xlabel("nodes (network namespaces; x: ringattn plan's prediction)")
        ax.set_ylabel(ylabel)
        ax.set_ylim(0, 110)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
    left.legend(fontsize=8)
    fig.suptitle("ringattn on the cluster in a box: real TCP between namespaces, links capped by tbf", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print("\nwrote %s" % path)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out")
    parser.add_argument("-o", "--output")
    args = parser.parse_args()
    rows = collect(args.out)
    if not rows:
        sys.exit("netns_report.py: no RATE-SERIES-NODES.json files in %s" % args.out)
    table(rows)
    if args.output:
        plot(rows, args.output)


if __name__ == "__main__":
    main()
