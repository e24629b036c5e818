#!/usr/bin/env python3
"""PyTorch's CPU scaled_dot_product_attention on the shapes of `ringattn bench --kernel`.

A server for the kernel benchmark, which interleaves it with its own measurements row by row (a
machine whose speed drifts then slows both alike). Prints one JSON line first:
{"torch": version, "capability": torch.backends.cpu.get_cpu_capability(), "threads": N}; then
reads one request per line, "HEAD_DIM DTYPE CAUSAL HEADS KV_HEADS" (DTYPE fp32|bf16, CAUSAL
0|1), and answers each with {"forward": seconds, "backward": seconds}: medians of --iters timed
repetitions after one warm-up. The backward is o.backward(dO), which includes PyTorch's
rowsum(dO * O). Exits 3 when torch cannot be imported, so the caller can leave the column empty.
"""
import argparse
import json
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=3)
    args = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except Exception as e:  # noqa: BLE001 - any import failure means "not available"
        print(f"torch not available: {e}", file=sys.stderr)
        sys.exit(3)
    torch.set_num_threads(args.threads)
    print(json.dumps({"torch": torch.__version__, "capability": torch.backends.cpu.get_cpu_capability(),
                      "threads": torch.get_num_threads()}))
    sys.stdout.flush()
    L = args.seq_len
    types = {"fp32": torch.float32, "bf16": torch.bfloat16}
    for line in sys.stdin:
        fields = line.split()
        if not fields:
            continue
        d, dtype, causal, heads, kv_heads = int(fields[0]), fields[1], fields[2] == "1", int(fields[3]), int(fields[4])
        q = torch.randn(1, heads, L, d, dtype=types[dtype], requires_grad=True)
        k, v = (torch.randn(1, kv_heads, L, d, dtype=types[dtype], requires_grad=True) for _ in range(2))
        gqa = {"enable_gqa": True} if kv_heads != heads else {}
        fwd, bwd = [], []
        for it in range(args.iters + 1):
            t0 = time.perf_counter()
            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, **gqa)
            t1 = time.perf_counter()
            o.backward(torch.ones_like(o))
            t2 = time.perf_counter()
            if it:  # the first is warm-up
                fwd.append(t1 - t0)
                bwd.append(t2 - t1)
            q.grad = k.grad = v.grad = None
        print(json.dumps({"forward": statistics.median(fwd), "backward": statistics.median(bwd)}))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
