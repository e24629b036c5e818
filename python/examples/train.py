"""A training loop with ringattn: a small decoder-only language model whose causal attention runs
over a sequence sharded across the ranks. Every rank holds its own rows of the sequence; the
parameters are replicated and their gradients summed over the ranks (data parallel over rows).

  source launch/env.sh && mpirun -np 4 python3 python/examples/train.py
"""
import math

import torch
from mpi4py import MPI

import ringattn

L, VOCAB, D_MODEL, HEADS = 16384, 64, 64, 4
HEAD_DIM = D_MODEL // HEADS
comm = MPI.COMM_WORLD


def rope(x, pos):
    """Rotary embedding at the rows' *global* positions (from ringattn.positions)."""
    inv_freq = 10000.0 ** (-torch.arange(0, HEAD_DIM, 2, dtype=torch.float32) / HEAD_DIM)
    angle = pos.float()[:, None] * inv_freq
    cos, sin = (torch.cat([f(angle)] * 2, -1)[None, :, None] for f in (torch.cos, torch.sin))
    half = HEAD_DIM // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, D_MODEL)
        torch.nn.init.normal_(self.embed.weight, std=0.1)
        self.norm1, self.norm2, self.norm3 = (torch.nn.LayerNorm(D_MODEL) for _ in range(3))
        self.qkv = torch.nn.Linear(D_MODEL, 3 * D_MODEL, bias=False)
        self.out = torch.nn.Linear(D_MODEL, D_MODEL, bias=False)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(D_MODEL, 4 * D_MODEL), torch.nn.GELU(),
                                       torch.nn.Linear(4 * D_MODEL, D_MODEL))

    def forward(self, ids, pos):
        x = self.embed(ids)[None]
        q, k, v = self.qkv(self.norm1(x)).view(1, -1, 3, HEADS, HEAD_DIM).unbind(2)
        o = ringattn.attention(rope(q, pos), rope(k, pos), v, causal=True)  # this rank's rows, all keys
        x = x + self.out(o.reshape(1, -1, D_MODEL))
        x = x + self.mlp(self.norm2(x))
        return self.norm3(x)[0] @ self.embed.weight.t()  # tied output head


torch.manual_seed(0)  # the same initial weights and data on every rank
tokens = torch.cumsum(torch.randint(-2, 3, (L,)), 0).remainder(VOCAB)
pos = ringattn.positions(L, causal=True)           # global positions of this rank's rows (zigzag)
ids = ringattn.shard(tokens, dim=0, causal=True)   # this rank's tokens
labels = torch.where(pos + 1 < L, tokens[(pos + 1).clamp(max=L - 1)], -100)  # next token; none at the end

model = Model()
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
for step in range(20):
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(ids, pos), labels, ignore_index=-100, reduction="sum") / (L - 1)
    loss.backward()
    total = loss.detach().reshape(1)
    for t in [total] + [p.grad for p in model.parameters()]:  # sum over the ranks' rows
        comm.Allreduce(MPI.IN_PLACE, t.numpy(), op=MPI.SUM)
    opt.step()
    if ringattn.rank() == 0:
        print("step %2d  loss %.4f" % (step + 1, total.item()), flush=True)
