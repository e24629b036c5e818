#!/usr/bin/env python3
"""The cuDNN table of launch/gpu-check.sh: one rank of `ringattn --backend cuda` with --kernel cudnn
and --kernel own (each row a job's --json, checked with --check), beside torch SDPA's flash and
cuDNN backends and flash-attn (bench_torch_sdpa.py --backends flash,cudnn), in TFLOP/s as docs/reference.md
counts them (forward 4 B H D x visible pairs; backward 2.5 x that).

  cudnn_table.py --runs DIR --torch TORCH.json --out RESULT.json
DIR holds {cudnn,own}_D{d}_L{l}_{causal,full,window}.json.
"""
import argparse
import glob
import json
import os
import re


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def tflops(job, key, factor=1.0):
    if not job or not job.get(key):
        return None
    return factor * job["flops_forward"] / job[key] / 1e12


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", required=True)
    ap.add_argument("--torch")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch_run = load(args.torch) if args.torch else None
    theirs = {(p["head_dim"], p["seq_len"], bool(p["causal"])): p for p in (torch_run or {}).get("points", [])}
    rows = {}
    for path in glob.glob(os.path.join(args.runs, "*_D*_L*_*.json")):
        m = re.match(r"(cudnn|own)_D(\d+)_L(\d+)_(causal|full|window)\.json$", os.path.basename(path))
        if m:
            rows.setdefault((int(m[2]), int(m[3]), m[4]), {})[m[1]] = load(path)
    out = []
    print("# ringattn (1 rank, --kernel cudnn | own) vs torch SDPA (flash, cudnn) and flash-attn, TFLOP/s")
    print(f"# {'D':>4} {'L':>6} {'mask':>6} | {'fwd cudnn':>9} {'own':>6} {'flash':>6} {'t.cudnn':>7} {'fa':>6} | "
          f"{'bwd cudnn':>9} {'own':>6} {'flash':>6} {'t.cudnn':>7} {'fa':>6} | {'cudnn/flash fwd':>15} {'bwd':>5} | check")
    order = {"full": 0, "causal": 1, "window": 2}
    for (d, l, mask) in sorted(rows, key=lambda k: (k[0], k[1], order[k[2]])):
        ours = rows[(d, l, mask)]
        t = theirs.get((d, l, mask == "causal"), {}) if mask != "window" else {}  # SDPA has no window
        r = {"head_dim": d, "seq_len": l, "mask": mask}
        for pass_, key, factor in (("forward", "forward_s", 1.0), ("backward", "backward_s", 2.5)):
            r[f"cudnn_{pass_}"] = tflops(ours.get("cudnn"), key, factor)
            r[f"own_{pass_}"] = tflops(ours.get("own"), key, factor)
            r[f"torch_flash_{pass_}"] = t.get(f"{pass_}_tflops")
            r[f"torch_cudnn_{pass_}"] = t.get(f"cudnn_{pass_}_tflops")
            r[f"flash_attn_{pass_}"] = t.get(f"flash_attn_{pass_}_tflops")
            a, b = r[f"cudnn_{pass_}"], r[f"torch_flash_{pass_}"]
            r[f"{pass_}_ratio_flash"] = a / b if a and b else None
        r["check"] = ";".join(f"{k}:{'ok' if v and 'max_abs_err' in v else 'missing'}" for k, v in sorted(ours.items()))
        out.append(r)

        def f(x, w=6):
            return format(x, f"{w}.1f") if isinstance(x, float) else "-".rjust(w)

        def g(x, w):
            return format(x, f"{w}.2f") if isinstance(x, float) else "-".rjust(w)

        print(f"  {d:>4} {l:>6} {mask:>6} | {f(r['cudnn_forward'], 9)} {f(r['own_forward'])} "
              f"{f(r['torch_flash_forward'])} {f(r['torch_cudnn_forward'], 7)} {f(r['flash_attn_forward'])} | "
              f"{f(r['cudnn_backward'], 9)} {f(r['own_backward'])} {f(r['torch_flash_backward'])} "
              f"{f(r['torch_cudnn_backward'], 7)} {f(r['flash_attn_backward'])} | {g(r['forward_ratio_flash'], 15)} "
              f"{g(r['backward_ratio_flash'], 5)} | {r['check']}")
    with open(args.out, "w") as fh:
        json.dump({"torch": (torch_run or {}).get("config", {}), "rows": out}, fh, indent=1)
    print(f"# written: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
