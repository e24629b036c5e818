#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention with the FlashAttention backend on the shapes of
ringattn_gpu_bench, timed the same way (CUDA events, warm-up, median), FLOPs counted as docs/reference.md
says (forward 4 B H D x visible pairs, backward 2.5 x that). The yardstick of launch/gpu-check.sh.
When the flash-attn package is importable, its flash_attn_func is timed too (flash_attn_* keys);
--backends flash,cudnn also times torch's cuDNN backend (SDPBackend.CUDNN_ATTENTION, cudnn_* keys).

  bench_torch_sdpa.py [--json FILE] [--dtype bf16|fp16] [--heads 16] [--batch 1]
                      [--head-dims 64,128] [--lengths 4096,8192,16384,32768] [--causal both|yes|no]
                      [--warmup 2] [--iters 5] [--no-backward]
  bench_torch_sdpa.py --compare OURS.json TORCH.json [--steps STEPS.txt] --out RESULT.json
      prints one table (our TFLOP/s, torch's, their ratio) and writes it as JSON.
"""
import argparse
import json
import statistics
import sys


def int_list(text):
    return [int(x) for x in text.split(",") if x]


def visible_pairs(length, causal):
    return length * (length + 1) // 2 if causal else length * length


def bench(args):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if not torch.cuda.is_available():
        print("bench_torch_sdpa: no CUDA device visible", file=sys.stderr)
        return 4
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    dev = torch.device("cuda")
    causal_values = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]
    name = torch.cuda.get_device_name(0)
    print(f"# torch {torch.__version__} scaled_dot_product_attention (flash) on {name}")
    print(f"# {args.dtype}, batch {args.batch}, heads {args.heads}, "
          f"median of {args.iters} after {args.warmup} warm-up")
    print(f"# {'D':>4} {'L':>7} {'causal':>6} {'fwd_ms':>10} {'fwd_TF/s':>10} {'bwd_ms':>10} {'bwd_TF/s':>10}")

    def timed(fn):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for i in range(args.warmup + args.iters):
            start.record()
            fn()
            stop.record()
            torch.cuda.synchronize()
            if i >= args.warmup:
                times.append(start.elapsed_time(stop))
        return statistics.median(times)

    try:
        from flash_attn import flash_attn_func
    except Exception:  # not installed, or built for another torch/CUDA
        flash_attn_func = None
    if flash_attn_func is not None:
        print("# flash-attn importable: timed too (flash_attn_* keys)")

    points = []

    def write_json():  # after every point, so that a run stopped by a timeout keeps its results
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"config": {"device": name, "torch": torch.__version__, "dtype": args.dtype,
                                      "batch": args.batch, "heads": args.heads, "warmup": args.warmup,
                                      "iters": args.iters}, "points": points}, f, indent=1)

    for head_dim in args.head_dims:
        for length in args.lengths:
            for causal in causal_values:
                shape = (args.batch, args.heads, length, head_dim)
                gen = torch.Generator(device=dev).manual_seed(head_dim * 100003 + length)
                q, k, v, dout = (torch.randn(shape, device=dev, dtype=dtype, generator=gen) for _ in range(4))
                flops = 4.0 * args.batch * args.heads * head_dim * visible_pairs(length, causal)
                point = {"head_dim": head_dim, "seq_len": length, "causal": causal}
                def sdpa_times(backend):  # (forward ms, backward ms) of torch SDPA on one backend
                    with sdpa_kernel([backend]):
                        with torch.no_grad():
                            fwd_ms = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
                        bwd_ms = 0.0
                        if not args.no_backward:
                            qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
                            out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)

                            def backward():
                                qg.grad = kg.grad = vg.grad = None
                                out.backward(dout, retain_graph=True)

                            bwd_ms = timed(backward)
                            del out, qg, kg, vg
                    return fwd_ms, bwd_ms

                try:
                    fwd_ms, bwd_ms = sdpa_times(SDPBackend.FLASH_ATTENTION)
                    point.update(forward_ms=fwd_ms, forward_tflops=flops / (fwd_ms * 1e-3) / 1e12,
                                 backward_ms=bwd_ms,
                                 backward_tflops=2.5 * flops / (bwd_ms * 1e-3) / 1e12 if bwd_ms else 0.0)
                    if "cudnn" in args.backends:
                        try:
                            c_fwd, c_bwd = sdpa_times(SDPBackend.CUDNN_ATTENTION)
                            point.update(cudnn_forward_tflops=flops / (c_fwd * 1e-3) / 1e12,
                                         cudnn_backward_tflops=2.5 * flops / (c_bwd * 1e-3) / 1e12 if c_bwd else 0.0)
                        except RuntimeError as e:  # no cuDNN attention for this shape, GPU or torch
                            point["cudnn_error"] = str(e).splitlines()[0]
                    if flash_attn_func is not None:  # (B, L, H, D) layout
                        qf, kf, vf, dof = (t.transpose(1, 2).contiguous() for t in (q, k, v, dout))
                        with torch.no_grad():
                            fa_fwd = timed(lambda: flash_attn_func(qf, kf, vf, causal=causal))
                        qg, kg, vg = (t.detach().requires_grad_(True) for t in (qf, kf, vf))
                        out = flash_attn_func(qg, kg, vg, causal=causal)

                        def fa_backward():
                            qg.grad = kg.grad = vg.grad = None
                            out.backward(dof, retain_graph=True)

                        fa_bwd = 0.0 if args.no_backward else timed(fa_backward)
                        point.update(flash_attn_forward_tflops=flops / (fa_fwd * 1e-3) / 1e12,
                                     flash_attn_backward_tflops=2.5 * flops / (fa_bwd * 1e-3) / 1e12 if fa_bwd else 0.0)
                        del out, qg, kg, vg, qf, kf, vf, dof
                except RuntimeError as e:  # e.g. no flash kernel for this shape or GPU
                    point["error"] = str(e).splitlines()[0]
                points.append(point)
                if "error" in point:
                    print(f"  {head_dim:>4} {length:>7} {str(causal).lower():>6}  error: {point['error']}")
                else:
                    print(f"  {head_dim:>4} {length:>7} {'yes' if causal else 'no':>6} {point['forward_ms']:>10.3f} "
                          f"{point['forward_tflops']:>10.1f} {point['backward_ms']:>10.3f} {point['backward_tflops']:>10.1f}")
                sys.stdout.flush()
                write_json()
                del q, k, v, dout
                torch.cuda.empty_cache()
    write_json()
    return 0


def compare(args):
    def load(path):
        try:
            with open(path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return {"config": {}, "points": []}

    ours, torch_run = load(args.compare[0]), load(args.compare[1])
    steps = []
    if args.steps:
        try:
            with open(args.steps) as f:
                for line in f:
                    name, rc, secs = line.split()
                    steps.append({"step": name, "exit": int(rc), "seconds": int(secs)})
        except OSError:
            pass
    key = lambda p: (p["head_dim"], p["seq_len"], bool(p["causal"]))
    theirs = {key(p): p for p in torch_run.get("points", [])}
    rows = []
    for p in ours.get("points", []):
        t = theirs.get(key(p), {})
        row = {"head_dim": p["head_dim"], "seq_len": p["seq_len"], "causal": bool(p["causal"]),
               "kernel": p.get("kernel"),
               "ours_forward_tflops": p.get("forward_tflops"), "torch_forward_tflops": t.get("forward_tflops"),
               "ours_backward_tflops": p.get("backward_tflops"), "torch_backward_tflops": t.get("backward_tflops"),
               "ours_forward_ms": p.get("forward_ms"), "torch_forward_ms": t.get("forward_ms"),
               "ours_backward_ms": p.get("backward_ms"), "torch_backward_ms": t.get("backward_ms"),
               "flash_attn_forward_tflops": t.get("flash_attn_forward_tflops"),
               "flash_attn_backward_tflops": t.get("flash_attn_backward_tflops"),
               "ours_wrong": p.get("wrong"), "ours_max_abs_err": p.get("max_abs_err")}
        for d in ("forward", "backward"):
            a, b = row[f"ours_{d}_tflops"], row[f"torch_{d}_tflops"]
            row[f"{d}_ratio"] = a / b if a and b else None
            c = row[f"flash_attn_{d}_tflops"]
            row[f"{d}_ratio_flash_attn"] = a / c if a and c else None
        if "error" in t:
            row["torch_error"] = t["error"]
        rows.append(row)

    def fmt(x, spec):  # spec as "9.1f": a missing value is a right-aligned "-"
        if isinstance(x, (int, float)):
            return format(x, spec)
        return "-".rjust(int(spec.split(".")[0].rstrip("df")))

    print(f"# ringattn CUDA kernels vs torch SDPA (flash) on {ours.get('config', {}).get('device', '?')}, "
          f"{ours.get('config', {}).get('dtype', '?')}, heads {ours.get('config', {}).get('heads', '?')}, "
          f"batch {ours.get('config', {}).get('batch', '?')}; TFLOP/s as docs/reference.md counts them")
    print(f"# {'D':>4} {'L':>7} {'causal':>6} | {'fwd ours':>9} {'torch':>7} {'ratio':>6} | "
          f"{'bwd ours':>9} {'torch':>7} {'ratio':>6} | {'#wrong':>6}")
    for r in rows:
        print(f"  {r['head_dim']:>4} {r['seq_len']:>7} {'yes' if r['causal'] else 'no':>6} | "
              f"{fmt(r['ours_forward_tflops'], '9.1f')} {fmt(r['torch_forward_tflops'], '7.1f')} "
              f"{fmt(r['forward_ratio'], '6.2f')} | {fmt(r['ours_backward_tflops'], '9.1f')} "
              f"{fmt(r['torch_backward_tflops'], '7.1f')} {fmt(r['backward_ratio'], '6.2f')} | "
              f"{fmt(r['ours_wrong'], '6d')}")
    for s in steps:
        print(f"# step {s['step']:<10} exit {s['exit']:>3}  {s['seconds']:>4} s")
    result = {"device": ours.get("config", {}).get("device") or torch_run.get("config", {}).get("device"),
              "ours": ours.get("config", {}), "torch": torch_run.get("config", {}), "steps": steps, "points": rows}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"# written: {args.out}")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json")
    ap.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--head-dims", type=int_list, default=[64, 128])
    ap.add_argument("--lengths", type=int_list, default=[4096, 8192, 16384, 32768])
    ap.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--no-backward", action="store_true")
    ap.add_argument("--backends", type=lambda t: t.split(","), default=["flash"],
                    help="torch SDPA backends to time: flash, and cudnn (its cuDNN attention)")
    ap.add_argument("--compare", nargs=2, metavar=("OURS_JSON", "TORCH_JSON"))
    ap.add_argument("--steps")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.compare:
        if not args.out:
            ap.error("--compare needs --out")
        return compare(args)
    return bench(args)


if __name__ == "__main__":
    sys.exit(main())
