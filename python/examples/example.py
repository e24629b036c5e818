"""ringattn from PyTorch in a few lines: causal attention over a sequence sharded over the ranks,
forward and backward, checked against PyTorch on the whole sequence.

  source launch/env.sh && mpirun -np 2 python3 python/examples/example.py
"""
import math

import torch

import ringattn

B, L, H, D = 1, 4096, 4, 64
torch.manual_seed(0)  # the same whole tensors on every rank, for the check below
q, k, v = (torch.randn(B, L, H, D) for _ in range(3))

# Each rank takes its rows (zigzag for causal: balanced work), computes, and trains through them.
q_local, k_local, v_local = (ringattn.shard(x, causal=True).requires_grad_() for x in (q, k, v))
o_local = ringattn.attention(q_local, k_local, v_local, causal=True)
o_local.sum().backward()  # dq, dk, dv of this rank's rows, through the same ring

# Check: the whole output on every rank against PyTorch's own attention.
o = ringattn.unshard(o_local.detach(), causal=True)
s = torch.einsum("blhd,bmhd->bhlm", q, k) / math.sqrt(D)
s = s.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
expected = torch.einsum("bhlm,bmhd->blhd", s.softmax(-1), v)
assert (o - expected).abs().max() < 1e-4, "ringattn differs from PyTorch"
if ringattn.rank() == 0:
    print("%d ranks: rows per rank %d, max |o - torch| = %.2e, dq norm %.3f"
          % (ringattn.size(), q_local.shape[1], (o - expected).abs().max().item(), q_local.grad.norm().item()))
