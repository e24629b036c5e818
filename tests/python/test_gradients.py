"""ringattn.attention against a float64 PyTorch reference, under mpirun: o and the gradients dq,
dk, dv for every mask kind, GQA/MQA, uneven sequence lengths and every layout, by the
FlashAttention rule: |ring - fp64| <= 2 |torch same precision - fp64| + floor.
With --ulysses U: the hybrid (ulysses=U) on a few of these cases, and a U that does not divide
the heads or the ranks refused on every rank, naming both."""
import argparse
import sys
import threading

import torch

import ringattn
from reference import attention, dense_mask

torch.manual_seed(1234)
P, RANK = ringattn.size(), ringattn.rank()
failures = []
parser = argparse.ArgumentParser()
parser.add_argument("--ulysses", type=int, default=1)
U = parser.parse_args().ulysses  # the hybrid degree every case runs with


def backward_on_another_thread(o, dout):
    """o.backward(dout) on a thread of its own, as PyTorch's autograd runs the backward of CUDA
    tensors (on its device thread): the communicator, created by the forward on this thread, is
    taken over by that one (MPI_THREAD_SERIALIZED, which the module asks for)."""
    errors = []

    def run():
        try:
            o.backward(dout)
        except Exception as e:  # re-raised on this thread
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if errors:
        raise errors[0]


def run_case(name, L, H, Hkv, D, dtype=torch.float32, layout=None, backward_thread=False, **mask):
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
    sharding = dict(layout=layout, causal=mask.get("causal", False), ulysses=U)
    xs = [ringattn.shard(x.to(dtype), **sharding).requires_grad_() for x in (q, k, v)]
    o = ringattn.attention(*xs, layout=layout, ulysses=U, **mask)
    if backward_thread:
        backward_on_another_thread(o, ringattn.shard(dout.to(dtype), **sharding))
    else:
        o.backward(ringattn.shard(dout.to(dtype), **sharding))
    got = [ringattn.unshard(t.detach().double(), **sharding) for t in [o] + [x.grad for x in xs]]
    for label, r, s, e in zip(("o", "dq", "dk", "dv"), got, same, exact):
        err, yardstick = (r - e).abs().max().item(), (s - e).abs().max().item()
        floor = (1e-5 if dtype == torch.float32 else 1e-2) * max(1.0, e.abs().max().item())
        ok = err <= 2 * yardstick + floor
        if RANK == 0:
            print("%-28s %-3s err %.2e  torch %s %.2e  %s" % (name + ("" if U == 1 else " U=%d" % U),
                                                            label, err, str(dtype)[6:], yardstick,
                                                            "ok" if ok else "FAIL"))
        if not ok:
            failures.append((name, label))


def check_unshard_gradient(L=97, H=2, D=16):
    """A loss every rank computes from unshard()'s whole tensor backpropagates into each rank's
    rows: the gradient is shard() of the whole gradient, and through attention the same as
    o.backward(shard(dout)) (the ring is deterministic: equal bit for bit)."""
    g = torch.Generator().manual_seed(11)
    x, w = torch.randn(2, L, H, D, generator=g, dtype=torch.float64), torch.randn(2, L, H, D, generator=g)
    sharding = dict(causal=True, ulysses=U)
    x_local = ringattn.shard(x, **sharding).requires_grad_()
    whole = ringattn.unshard(x_local, **sharding)
    ((whole * w).sum() + (whole ** 2).sum()).backward()
    err = (x_local.grad - ringattn.shard(w + 2 * x, **sharding)).abs().max().item()
    qkv = torch.randn(3, 2, L, H * U, D, generator=g)
    q, k, v = (ringattn.shard(t, **sharding).requires_grad_() for t in qkv)
    dout = w.repeat(1, 1, U, 1).float()
    o = ringattn.attention(q, k, v, causal=True, ulysses=U)
    (ringattn.unshard(o, **sharding) * dout).sum().backward()
    through_unshard = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    ringattn.attention(q, k, v, causal=True, ulysses=U).backward(ringattn.shard(dout, **sharding))
    same = all(torch.equal(a, b.grad) for a, b in zip(through_unshard, (q, k, v)))
    ok = err <= 1e-12 and same
    if RANK == 0:
        print("unshard gradient: err %.1e, through attention %s  %s" % (err, "equal" if same else "DIFFERENT",
                                                                         "ok" if ok else "FAIL"))
    if not ok:
        failures.append(("unshard gradient", err, same))


def expect_refused(what, **kwargs):
    """ulysses=U with shapes it does not fit: ValueError naming ulysses and both numbers, on every rank."""
    H = kwargs.pop("heads")
    x = torch.zeros(1, 2 * P, H, 16)
    xs = [ringattn.shard(x)] * 3
    try:
        ringattn.attention(*xs, **kwargs)
    except ValueError as e:
        message = str(e)
        ok = message.startswith("ulysses ") and all(str(n) in message for n in what)
        if RANK == 0:
            print("refused: %s  %s" % (message, "ok" if ok else "FAIL"))
        if not ok:
            failures.append(("refused", message))
        return
    failures.append(("not refused", kwargs))


if U > 1:
    assert P % U == 0, "run under mpirun -np P with P a multiple of --ulysses"
    run_case("causal GQA uneven", 301, 2 * U, U, 16, causal=True)
    run_case("causal MQA striped ring", 250, U, 1, 16, layout="striped", causal=True, schedule="ring")
    run_case("window documents", 300, U, U, 16, window=(32, 16), doc_lens=[100, 1, 150, 49])
    run_case("causal bf16 MQA", 301, 2 * U, 1, 32, dtype=torch.bfloat16, causal=True)  # K/V heads replicated
    check_unshard_gradient()
    expect_refused(("%d" % U, "q.shape[2] %d" % (U + 1)), heads=U + 1, ulysses=U)  # H % U != 0
    expect_refused(("%d" % (P + 1), "%d ranks" % P), heads=P + 1, ulysses=P + 1)  # U does not divide P
    if failures:
        print("rank %d: FAILED %s" % (RANK, failures), file=sys.stderr)
        sys.exit(1)
    sys.exit(0)

check_unshard_gradient()
run_case("none", 256, 4, 4, 32)
run_case("causal GQA uneven", 301, 4, 2, 16, causal=True)
run_case("causal, backward on a thread", 301, 4, 2, 16, causal=True, backward_thread=True)
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
