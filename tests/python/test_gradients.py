"""ringattn.attention against a float64 PyTorch reference, under mpirun: o and the gradients dq,
dk, dv for every mask kind, GQA/MQA, uneven sequence lengths and every layout, by the
FlashAttention rule: |ring - fp64| <= 2 |torch same precision - fp64| + floor."""
import sys

import torch

import ringattn
from reference import attention, dense_mask

torch.manual_seed(1234)
P, RANK = ringattn.size(), ringattn.rank()
failures = []


def run_case(name, L, H, Hkv, D, dtype=torch.float32, layout=None, **mask):
    g = torch.Generator().manual_seed(len(name) * 7919 + L)  # the same on every rank
    B = 2
    q = torch.randn(B, L, H, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, L, Hkv, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, L, Hkv, D, generator=g, dtype=torch.float64)
    dout = torch.randn(B, L, H, D, generator=g, dtype=torch.float64)
    q, k, v, dout = (x.to(dtype).to(torch.float64) for x in (q, k, v, dout))  # representable in dtype
    block_mask = mask.get("block_mask")
    if "bigbird" in mask:
        block_mask = ringattn.masks.bigbird_block_mask(L, *mask["bigbird"], mask_block=mask["mask_block"],
                                                       seed=mask.get("seed", 0))
    visible = dense_mask(L, mask.get("causal", False), mask.get("window", (-1, -1)), mask.get("doc_lens"),
                         block_mask, mask.get("mask_block", 128))

    def grads(dt):
        xs = [x.detach().to(dt).clone().requires_grad_() for x in (q, k, v)]
        o = attention(*xs, visible, mask.get("softmax_scale"))
        o.backward(dout.to(dt))
        return [o.detach().double()] + [x.grad.double() for x in xs]

    exact = grads(torch.float64)
    same = grads(dtype if dtype != torch.bfloat16 else torch.float32)
    if dtype == torch.bfloat16:  # the yardstick: what bf16 storage of o and the gradients costs
        same = [x.to(torch.bfloat16).double() for x in same]
    causal = mask.get("causal", False)
    xs = [ringattn.shard(x.to(dtype), layout=layout, causal=causal).requires_grad_() for x in (q, k, v)]
    o = ringattn.attention(*xs, layout=layout, **mask)
    o.backward(ringattn.shard(dout.to(dtype), layout=layout, causal=causal))
    got = [ringattn.unshard(t.detach().double(), layout=layout, causal=causal) for t in [o] + [x.grad for x in xs]]
    for label, r, s, e in zip(("o", "dq", "dk", "dv"), got, same, exact):
        err, yardstick = (r - e).abs().max().item(), (s - e).abs().max().item()
        floor = (1e-5 if dtype == torch.float32 else 1e-2) * max(1.0, e.abs().max().item())
        ok = err <= 2 * yardstick + floor
        if RANK == 0:
            print("%-28s %-3s err %.2e  torch %s %.2e  %s" % (name, label, err, str(dtype)[6:], yardstick,
                                                            "ok" if ok else "FAIL"))
        if not ok:
            failures.append((name, label))


run_case("none", 256, 4, 4, 32)
run_case("causal GQA uneven", 301, 4, 2, 16, causal=True)
run_case("causal MQA striped ring", 250, 4, 1, 16, layout="striped", causal=True, schedule="ring")
run_case("window", 300, 2, 2, 16, window=(32, 16))
run_case("causal window contiguous", 299, 2, 1, 16, layout="contiguous", causal=True, window=(48, -1))
run_case("documents", 301, 2, 2, 16, doc_lens=[100, 1, 150, 50])
run_case("causal documents zigzag", 300, 4, 2, 16, causal=True, doc_lens=[120, 80, 100])
bm = torch.rand(5, 5, generator=torch.Generator().manual_seed(5)) < 0.5
bm.fill_diagonal_(False)  # some rows see no key at all: o = 0, no gradient
run_case("block mask", 300, 2, 2, 16, block_mask=bm, mask_block=64)
run_case("bigbird", 320, 2, 1, 16, bigbird=(1, 1, 1), mask_block=32, seed=3)
run_case("causal bf16 GQA", 301, 4, 2, 32, dtype=torch.bfloat16, causal=True)
run_case("block mask scale", 256, 2, 2, 16, block_mask=bm[:4, :4], mask_block=64, softmax_scale=0.3)
if failures:
    print("rank %d: FAILED %s" % (RANK, failures), file=sys.stderr)
    sys.exit(1)
