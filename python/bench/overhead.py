"""What the Python call costs over the C++ API (issue 14): ringattn.attention (checks, autograd
Function, contiguous copies, output allocation) against the compiled API called directly with
buffers allocated once, same shapes, same ranks, alternating, median of N.

  mpirun -np 2 python3 python/bench/overhead.py [--seq-len 8192 --heads 8 --head-dim 128 --iters 5]
"""
import argparse
import statistics
import time

import torch

import ringattn
from ringattn import _ringattn

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--seq-len", type=int, default=8192)
parser.add_argument("--heads", type=int, default=8)
parser.add_argument("--head-dim", type=int, default=128)
parser.add_argument("--iters", type=int, default=5)
parser.add_argument("--causal", action="store_true")
args = parser.parse_args()

P, rank = ringattn.size(), ringattn.rank()
L, H, D = args.seq_len, args.heads, args.head_dim
g = torch.Generator().manual_seed(0)
q, k, v = (ringattn.shard(torch.randn(1, L, H, D, generator=g), causal=args.causal) for _ in range(3))
ctx = ringattn._context(None)
spec = _ringattn.make_spec(args.causal, -1, -1, [], b"", 128, None, 0, 0.0, "", "direct", 1)
shard = (1, q.shape[1], H, H, D, False)
o = torch.empty_like(q)
lse = torch.empty(1, H, q.shape[1])


def python_call():
    ringattn.attention(q, k, v, causal=args.causal)


def api_call():
    ctx.forward(shard, spec, q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(), None)


times = {"python": [], "api": []}
python_call(), api_call()  # warm: the plan is cached by the first call
for _ in range(args.iters):
    for name, call in (("python", python_call), ("api", api_call)):
        ringattn.unshard(torch.zeros(1, q.shape[1]), causal=args.causal)  # a barrier of sorts
        t0 = time.perf_counter()
        call()
        times[name].append(time.perf_counter() - t0)
py, api = statistics.median(times["python"]), statistics.median(times["api"])
if rank == 0:
    print("L=%d H=%d D=%d %s on %d ranks, forward, median of %d: C++ API %.4f s, Python %.4f s: overhead %+.2f%%"
          % (L, H, D, "causal" if args.causal else "full", P, args.iters, api, py, 100 * (py / api - 1)))
