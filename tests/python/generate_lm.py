"""A real generation test of ringattn's inference path (issue 28): a small decoder-only model
(2 layers, GQA, RoPE) in plain PyTorch, its KV cache on ringattn (ringattn.KVCache per layer, the
prompt by ringattn.prefill from this rank's rows, each new token by ringattn.decode), greedily
generates 32 tokens after a 4K-token prompt; it must give the same tokens, and the same logits to
fp32 rounding, as the same model in one process with its own attention and its own cache.

  mpirun -np P python3 generate_lm.py
"""
import math
import sys

import torch
from mpi4py import MPI

import ringattn

PROMPT, NEW, VOCAB, D_MODEL, HEADS, KV_HEADS, LAYERS = 4096, 32, 64, 64, 4, 2, 2
HEAD_DIM = D_MODEL // HEADS  # 16


def rope(x, pos, theta=10000.0):
    inv_freq = theta ** (-torch.arange(0, HEAD_DIM, 2, dtype=torch.float32) / HEAD_DIM)
    angle = pos.to(torch.float32)[:, None] * inv_freq[None, :]
    cos, sin = torch.cat([angle.cos()] * 2, -1)[None, :, None], torch.cat([angle.sin()] * 2, -1)[None, :, None]
    half = HEAD_DIM // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1 = torch.nn.LayerNorm(D_MODEL)
        self.q = torch.nn.Linear(D_MODEL, HEADS * HEAD_DIM, bias=False)
        self.kv = torch.nn.Linear(D_MODEL, 2 * KV_HEADS * HEAD_DIM, bias=False)
        self.proj = torch.nn.Linear(D_MODEL, D_MODEL, bias=False)
        self.norm2 = torch.nn.LayerNorm(D_MODEL)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(D_MODEL, 2 * D_MODEL), torch.nn.GELU(),
                                       torch.nn.Linear(2 * D_MODEL, D_MODEL))

    def forward(self, x, pos, attend):
        h = self.norm1(x)
        q = self.q(h).view(1, -1, HEADS, HEAD_DIM)
        k, v = self.kv(h).view(1, -1, 2, KV_HEADS, HEAD_DIM).unbind(2)
        x = x + self.proj(attend(rope(q, pos), rope(k, pos), v).reshape(1, -1, D_MODEL))
        return x + self.mlp(self.norm2(x))


class TinyDecoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(VOCAB, D_MODEL)
        self.layers = torch.nn.ModuleList(Layer() for _ in range(LAYERS))
        self.norm = torch.nn.LayerNorm(D_MODEL)

    def forward(self, ids, pos, attends):
        x = self.embed(ids)[None]
        for layer, attend in zip(self.layers, attends):
            x = layer(x, pos, attend)
        return self.norm(x)[0] @ self.embed.weight.t()  # (rows, vocab)


def prompt():
    g = torch.Generator().manual_seed(3)
    return torch.cumsum(torch.randint(-2, 3, (PROMPT,), generator=g), 0).remainder(VOCAB)


class TorchCache:
    """The single-process reference: its own K/V cache and plain causal attention."""

    def __init__(self):
        self.k = self.v = None

    def __call__(self, q, k, v):
        first = 0 if self.k is None else self.k.shape[1]
        self.k = k if self.k is None else torch.cat([self.k, k], 1)
        self.v = v if self.v is None else torch.cat([self.v, v], 1)
        kk = self.k.repeat_interleave(HEADS // KV_HEADS, 2)
        vv = self.v.repeat_interleave(HEADS // KV_HEADS, 2)
        out = []
        for start in range(0, q.shape[1], 512):  # blocks of queries: no (L, L) matrix
            qb = q[:, start:start + 512]
            s = torch.einsum("blhd,bmhd->bhlm", qb, kk) / math.sqrt(HEAD_DIM)
            i = first + start + torch.arange(qb.shape[1])[:, None]
            s = s.masked_fill(torch.arange(kk.shape[1])[None, :] > i, float("-inf"))
            out.append(torch.einsum("bhlm,bmhd->blhd", s.softmax(-1), vv))
        return torch.cat(out, 1)


def generate_reference(model, ids):
    caches = [TorchCache() for _ in range(LAYERS)]
    logits = model(ids, torch.arange(PROMPT), caches)[-1]
    tokens, all_logits = [], []
    for step in range(NEW):
        all_logits.append(logits)
        tokens.append(int(logits.argmax()))
        logits = model(torch.tensor([tokens[-1]]), torch.tensor([PROMPT + step]), caches)[-1]
    return tokens, torch.stack(all_logits)


def generate_ringattn(model, ids, comm):
    P = comm.Get_size()
    caches = [ringattn.KVCache(1, KV_HEADS, HEAD_DIM, PROMPT // P + NEW + 64) for _ in range(LAYERS)]
    pos = torch.tensor(caches[0].prefill_positions(PROMPT), dtype=torch.int64)
    assert pos.tolist() == ringattn.positions(PROMPT, causal=True).tolist()
    rows_logits = model(ids[pos], pos, [lambda q, k, v, c=c: ringattn.prefill(q, k, v, c) for c in caches])
    # The last prompt position's logits, from the rank that holds it.
    mine = torch.zeros(VOCAB)
    if (pos == PROMPT - 1).any():
        mine = rows_logits[int((pos == PROMPT - 1).nonzero()[0, 0])]
    logits = torch.from_numpy(comm.allreduce(mine.numpy()))
    tokens, all_logits = [], []
    decode = [lambda q, k, v, c=c: ringattn.decode(q, k, v, c) for c in caches]
    for step in range(NEW):
        all_logits.append(logits)
        tokens.append(int(logits.argmax()))
        logits = model(torch.tensor([tokens[-1]]), torch.tensor([PROMPT + step]), decode)[-1]
    for c in caches:
        assert c.lengths() == [PROMPT + NEW], c.lengths()
        assert max(c.rows(0, r) for r in range(P)) <= (PROMPT + NEW) // P + 2, [c.rows(0, r) for r in range(P)]
    return tokens, torch.stack(all_logits)


def main():
    comm = MPI.COMM_WORLD
    model = TinyDecoder().eval()
    ids = prompt()
    with torch.no_grad():
        ref_tokens, ref_logits = generate_reference(model, ids)
        tokens, logits = generate_ringattn(model, ids, comm)
    failures = []
    if tokens != ref_tokens:
        failures.append("tokens differ:\n  ringattn %s\n  pytorch  %s" % (tokens, ref_tokens))
    err = (logits - ref_logits).abs().max().item()
    scale = ref_logits.abs().max().item()
    if not err <= 2e-5 * max(scale, 1.0):  # fp32 rounding through 2 layers (the logits are O(1))
        failures.append("logits differ by %.3e (scale %.3e)" % (err, scale))
    # The same tokens and logits on every rank.
    if comm.allgather(tokens) != [tokens] * comm.Get_size():
        failures.append("ranks generated different tokens")
    if comm.Get_rank() == 0:
        print("P=%d: %d tokens after a %d-token prompt, max |logit - PyTorch's| %.2e" % (comm.Get_size(), NEW, PROMPT,
                                                                                           err))
    if failures:
        print("FAILED on rank %d: %s" % (comm.Get_rank(), "; ".join(failures)))
        sys.exit(1)
    # No autograd: a tensor that requires grad is refused on every rank.
    c = ringattn.KVCache(1, KV_HEADS, HEAD_DIM, 8)
    q = torch.zeros(1, 1, HEADS, HEAD_DIM, requires_grad=True)
    k = torch.zeros(1, 1, KV_HEADS, HEAD_DIM)
    try:
        ringattn.decode(q, k, k, c)
        print("FAILED: decode took a tensor that requires grad")
        sys.exit(1)
    except ValueError as e:
        assert "requires grad" in str(e), e


if __name__ == "__main__":
    main()
