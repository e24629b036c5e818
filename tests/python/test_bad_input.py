"""Bad input to ringattn.attention under mpirun -np 2: one rank's mistake raises the right
exception, naming the argument, on every rank, and the next good call works (nothing moved).
Then a stopped peer: rank 1 stops answering, rank 0 gets RuntimeError within the timeout."""
import os
import sys
import time

import numpy
import torch

import ringattn

P, RANK = ringattn.size(), ringattn.rank()
assert P == 2, "run under mpirun -np 2"
L, H, D = 64, 2, 16
ringattn.configure(timeout=3.0)


def shards(dtype=torch.float32, kv_heads=H):
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, L, h, D, generator=g).to(dtype) for h in (H, kv_heads, kv_heads))
    return [ringattn.shard(x) for x in (q, k, v)]


def expect(kind, argument, make_args, **kwargs):
    """Rank 0 passes make_args(True)'s mistake, rank 1 good arguments: both must raise."""
    q, k, v = make_args(RANK == 0)
    try:
        ringattn.attention(q, k, v, **(kwargs if RANK == 0 else {}))
    except kind as e:
        # The message leads with the argument, in Python's words (a keyword, or the tensor's shape).
        assert str(e).startswith(argument), "rank %d: %r does not name %s" % (RANK, str(e), argument)
        return str(e)
    raise AssertionError("rank %d: no %s for %s" % (RANK, kind.__name__, argument))


good = shards()
messages = [
    expect(TypeError, "q", lambda bad: ["not a tensor" if bad else good[0]] + good[1:]),
    expect(TypeError, "k", lambda bad: [good[0], good[1].half() if bad else good[1], good[2]]),
    expect(TypeError, "k", lambda bad: [good[0], good[1].numpy() if bad else good[1], good[2]]),
    expect(ValueError, "q", lambda bad: [good[0][0] if bad else good[0]] + good[1:]),
    expect(ValueError, "v", lambda bad: good[:2] + [good[2][:, :-1] if bad else good[2]]),
    expect(ValueError, "q.shape[1]", lambda bad: [x[:, :-1] if bad else x for x in good]),  # rows off the layout
    expect(ValueError, "k", lambda bad: shards(kv_heads=1) if bad else good),      # shapes differ by rank
    expect(ValueError, "window", lambda bad: good, window=(-5, 3)),
    expect(ValueError, "layout", lambda bad: good, layout="diagonal"),
    expect(ValueError, "the attention keywords", lambda bad: good, causal=True),    # masks differ by rank
    expect(ValueError, "softmax_scale", lambda bad: good, softmax_scale=-1.0),
    expect(ValueError, "softmax_scale", lambda bad: good, softmax_scale=1e-50),    # 0 in fp32
    expect(ValueError, "block_mask", lambda bad: good, block_mask=torch.ones(3)),
]
# Documents that do not sum to L: the same mistake on every rank.
try:
    ringattn.attention(*good, doc_lens=[10, 10])
    raise AssertionError("doc_lens not refused")
except ValueError as e:
    assert str(e).startswith("doc_lens sum to 20"), str(e)
# Nothing moved: a good call still works, strided and as NumPy (forward only).
o = ringattn.attention(*[x.transpose(1, 2).contiguous().transpose(1, 2) for x in good], causal=True)
o_np = ringattn.attention(*[x.numpy() for x in good], causal=True)
assert isinstance(o_np, numpy.ndarray) and numpy.allclose(o.numpy(), o_np)
if RANK == 0:
    print("bad input: %d mistakes refused on every rank, e.g.\n  %s" % (len(messages), "\n  ".join(messages[:7])))

# A stopped peer: rank 1 does not call; rank 0 must get RuntimeError after the 3 s timeout. Rank 1
# stays away longer than anything but a hang takes (mpirun ends it when rank 0 ends without
# MPI_Finalize); rank 0's bound, the timeout and a minute, likewise only says it did not hang.
sys.stdout.flush()
if RANK == 1:
    time.sleep(120)
    os._exit(0)
t0 = time.time()
try:
    ringattn.attention(*good, causal=True)
    print("rank 0: FAILED: no error with a stopped peer", flush=True)
    os._exit(1)
except RuntimeError as e:
    elapsed = time.time() - t0
    if elapsed >= 3.0 + 60.0:
        print("rank 0: FAILED: hung for %.1f s" % elapsed, flush=True)
        os._exit(1)
    print("stopped peer: RuntimeError after %.1f s (timeout 3 s): %s" % (elapsed, str(e).splitlines()[0]), flush=True)
    os._exit(0)
