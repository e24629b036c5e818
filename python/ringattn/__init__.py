"""ringattn from Python: exact attention over a sequence sharded across MPI ranks.

Each rank passes its own rows (``ringattn.shard``) and gets its rows of the output; autograd gives
dq, dk and dv through the same ring. Run under ``mpirun -np P python3 script.py`` (docs/reference.md
"From Python"). The compiled half (``_ringattn``) takes data pointers and shapes: no libtorch is
linked. Arguments are judged by the library, which names them by their keywords here (a bad value
raises ValueError, a bad type TypeError, on every rank).
"""
import importlib.util as _util

# A CUDA build of the compiled half links NCCL and the CUDA runtime; PyTorch's CUDA wheels bring
# their own, newer, under the same sonames, and whichever loads first serves the whole process.
# PyTorch's has every symbol ours needs, not the reverse (its libtorch_cuda fails to load on an
# older system NCCL), so PyTorch loads first when it is installed.
if _util.find_spec("torch") is not None:
    import torch as _torch  # noqa: F401
from . import _ringattn, masks
from ._checks import attention_error as _attention_error, element_type as _element_type, spec_args as _spec_args
from ._core import configure, positions, rank, shard, size
from ._core import check_unshard as _check_unshard, context as _context, is_numpy as _is_numpy
from ._core import numpy_forward as _numpy_forward, torch_forward as _torch_forward
from ._inference import KVCache, decode, prefill

__all__ = ["attention", "shard", "unshard", "positions", "rank", "size", "configure", "version", "KVCache", "prefill",
           "decode"]
__version__ = _ringattn.version()


def version():
    return _ringattn.version()


def unshard(x_local, dim=1, layout=None, causal=False, comm=None, ulysses=1):
    """The whole tensor from every rank's rows (the inverse of shard), on every rank.

    Differentiable: its backward is shard() of the gradient, so that a loss every rank computes
    alike from the whole tensor backpropagates into each rank's rows."""
    _check_unshard(x_local, dim, ulysses)
    from ._autograd import UnshardFunction
    return UnshardFunction.apply(x_local, dim, layout, causal, comm, ulysses)


def attention(q, k, v, *, causal=False, window=(-1, -1), doc_lens=None, block_mask=None, mask_block=128,
              softmax_scale=None, layout=None, schedule="direct", return_lse=False, comm=None, bigbird=None, seed=0,
              ulysses=1, kernel="auto", deterministic=False):
    """Exact attention of this rank's queries against every visible key of every rank.

    q (B, L_local, H, D), k and v (B, L_local, Hkv, D): this rank's rows (ringattn.shard), float32
    or bfloat16 (float16 on CUDA tensors), any strides. Returns o (q's shape and dtype), and lse
    (B, H, L_local) float32 with return_lse=True. Differentiable for torch tensors; NumPy arrays
    (float32) are forward only.
    bigbird=(GLOBAL, WINDOW, RANDOM) with seed generates a BigBird block mask of mask_block blocks.
    ulysses=U (hybrid parallelism): an all-to-all inside groups of U ranks swaps sequence for heads
    and the ring runs across the groups. U divides the ranks and the heads H (and divides Hkv or is
    a multiple of it); the rows a rank holds change with U: take them with shard(..., ulysses=U).
    The results equal those of ulysses=1 to fp32 rounding.
    CUDA tensors (builds with CUDA) run on the CUDA backend with NCCL, ordered on the device with
    torch's current stream (after the kernels that wrote q, k, v; no device-wide sync). There,
    kernel="auto" runs cuDNN's fused attention for the ring steps it can express and ours for the
    rest, "cudnn" refuses a call it cannot run, "own" runs ours only; deterministic=True makes the
    backward bitwise reproducible (docs/gpu.md).
    """
    device = "cuda" if getattr(q, "is_cuda", False) else "cpu"
    ctx = _context(comm, device)
    problem = _attention_error(q, k, v, device)
    spec = failure = None
    if problem is None:
        problem, args = _spec_args(causal, window, doc_lens, block_mask, mask_block, softmax_scale, layout, schedule,
                                   return_lse, bigbird, seed, ulysses, kernel, deterministic)
    if problem is None:
        spec, failure = _ringattn.make_spec(*args)
    if problem is not None:
        failure = (problem[1], "{%s}: %s" % (problem[1], problem[2]), problem[0] is TypeError)
    if failure is not None:  # every rank raises: the others learn of it in the agreement
        ctx.fail(*failure)
    B, L, H, D = (int(n) for n in q.shape)
    shard_ = (B, L, H, int(k.shape[2]), D, _element_type(q))
    if _is_numpy(q):
        return _numpy_forward(ctx, shard_, spec, q, k, v, return_lse)
    import torch
    from ._autograd import RingAttentionFunction
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        o, lse = RingAttentionFunction.apply(q, k, v, ctx, shard_, spec)
    else:
        o, lse = _torch_forward(ctx, shard_, spec, q, k, v)[:2]
    return (o, lse) if return_lse else o
