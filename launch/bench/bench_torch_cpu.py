#!/usr/bin/env python3
"""PyTorch's CPU scaled_dot_product_attention on the shapes of `ringattn bench --kernel`.

Prints one JSON object per line: {"head_dim", "dtype", "causal", "pass", "seconds", "gflops"}, with FLOPs
counted as ringattn counts them (forward 4*B*H*D*visible pairs, backward 2.5x). Exits 3 when
torch cannot be imported, so the caller can leave the column empty.
"""
import argparse
import json
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--dtypes", default="fp32", help="fp32 and/or bf16, comma-separated")
    args = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except Exception as e:  # noqa: BLE001 - any import failure means "not available"
        print(f"torch not available: {e}", file=sys.stderr)
        sys.exit(3)
    torch.set_num_threads(args.threads)
    L, H = args.seq_len, args.heads
    types = {"fp32": torch.float32, "bf16": torch.bfloat16}
    for d in [int(x) for x in args.head_dims.split(",")]:
      for dtype in args.dtypes.split(","):
        for causal in (False, True):
            q, k, v = (torch.randn(1, H, L, d, dtype=types[dtype], requires_grad=True) for _ in range(3))
            pairs = L * (L + 1) // 2 if causal else L * L
            flops = 4.0 * H * d * pairs
            fwd, bwd = [], []
            for it in range(args.iters + 1):
                t0 = time.perf_counter()
                o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                t1 = time.perf_counter()
                o.backward(torch.ones_like(o))
                t2 = time.perf_counter()
                if it:  # the first is warm-up
                    fwd.append(t1 - t0)
                    bwd.append(t2 - t1)
                q.grad = k.grad = v.grad = None
            for name, times, f in (("forward", fwd, flops), ("backward", bwd, 2.5 * flops)):
                s = statistics.median(times)
                print(json.dumps({"head_dim": d, "dtype": dtype, "causal": causal, "pass": name, "seconds": s,
                                  "gflops": f / s / 1e9}))
                sys.stdout.flush()


if __name__ == "__main__":
    main()
