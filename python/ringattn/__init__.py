"""ringattn from Python: exact attention over a sequence sharded across MPI ranks.

Each rank passes its own rows (``ringattn.shard``) and gets its rows of the output; autograd gives
dq, dk and dv through the same ring. Run under ``mpirun -np P python3 script.py`` (SPEC.md "From Python").
The compiled half (``_ringattn``) takes data pointers and shapes: no libtorch is linked.
"""
import atexit as _atexit
import zlib as _zlib

from . import _ringattn, masks
from ._checks import attention_error as _attention_error, comm_handle as _comm_handle, dtype_name as _dtype_name
from ._checks import is_bf16 as _is_bf16, mask_args as _mask_args

__all__ = ["attention", "shard", "unshard", "positions", "rank", "size", "configure", "version"]
__version__ = _ringattn.version()

_options = {"threads": 0, "timeout": 300.0}
_contexts = {}


def version():
    return _ringattn.version()


def configure(threads=None, timeout=None):
    """Options of the contexts created from now on: CPU threads per rank (0: the node's cores
    shared among its ranks) and the timeout in seconds after which a silent peer is an error."""
    if threads is not None:
        if not isinstance(threads, int) or threads < 0:
            raise ValueError("threads: expected an integer >= 0, got %r" % (threads,))
        _options["threads"] = threads
    if timeout is not None:
        if not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ValueError("timeout: expected a positive number of seconds, got %r" % (timeout,))
        _options["timeout"] = float(timeout)


def _context(comm, device="cpu"):
    handle = _comm_handle(comm)
    key = (handle, device, _options["threads"], _options["timeout"])
    ctx = _contexts.get(key)
    if ctx is None:  # collective over comm: every rank reaches here on the same call
        backend, transport = ("cuda", "nccl") if device == "cuda" else ("cpu", "mpi")
        ctx = _ringattn.Context(handle, backend, transport, _options["threads"], _options["timeout"])
        _contexts[key] = ctx
    return ctx


@_atexit.register
def _release():
    # Contexts hold duplicates of MPI communicators: free them before MPI ends (after it, leave them).
    if _ringattn.mpi_finalized():
        for ctx in _contexts.values():
            _leaked.append(ctx)
    _contexts.clear()
    _ringattn.finalize()


_leaked = []


def rank(comm=None):
    return _ringattn.comm_rank(_comm_handle(comm))


def size(comm=None):
    return _ringattn.comm_size(_comm_handle(comm))


def _layout_name(layout):
    if layout is None:
        return ""
    if layout not in ("contiguous", "zigzag", "striped"):
        raise ValueError("layout: %r, expected None, 'contiguous', 'zigzag' or 'striped'" % (layout,))
    return layout


def _ulysses_degree(ulysses):
    if not isinstance(ulysses, int) or isinstance(ulysses, bool):
        raise TypeError("ulysses: expected an int, got %s" % type(ulysses).__name__)
    return ulysses


def _positions_list(seq_len, layout, causal, comm, rank_=-1, ulysses=1):
    if not isinstance(seq_len, int) or isinstance(seq_len, bool):
        raise TypeError("seq_len: expected an int, got %s" % type(seq_len).__name__)
    return _context(comm).positions(seq_len, bool(causal), _layout_name(layout), rank_, _ulysses_degree(ulysses))


def positions(seq_len, layout=None, causal=False, comm=None, ulysses=1):
    """int64 global positions of this rank's rows (for RoPE and labels), as a torch tensor.
    ulysses: the degree attention() is called with (it changes which rows a rank holds)."""
    import torch
    return torch.tensor(_positions_list(seq_len, layout, causal, comm, ulysses=ulysses), dtype=torch.int64)


def _is_numpy(x):
    return type(x).__module__ == "numpy"


def shard(x, dim=1, layout=None, causal=False, comm=None, ulysses=1):
    """This rank's rows of a whole tensor (or NumPy array) x along dim, in the layout's order
    (with ulysses=U, the layout's rows of each group of U ranks, split among its members)."""
    if not (_is_numpy(x) or type(x).__module__.startswith("torch")):
        raise TypeError("x: expected a torch.Tensor or numpy.ndarray, got %s" % type(x).__name__)
    if not isinstance(dim, int) or not -x.ndim <= dim < x.ndim:
        raise ValueError("dim: %r is not a dimension of x (%d dimensions)" % (dim, x.ndim))
    pos = _positions_list(int(x.shape[dim]), layout, causal, comm, ulysses=ulysses)
    if _is_numpy(x):
        import numpy
        return numpy.take(x, pos, axis=dim)
    import torch
    return x.index_select(dim, torch.tensor(pos, dtype=torch.int64, device=x.device))


def unshard(x_local, dim=1, layout=None, causal=False, comm=None, ulysses=1):
    """The whole tensor from every rank's rows (the inverse of shard), on every rank.

    Differentiable: its backward is shard() of the gradient, so that a loss every rank computes
    alike from the whole tensor backpropagates into each rank's rows."""
    import torch
    if not isinstance(x_local, torch.Tensor):
        raise TypeError("x_local: expected a torch.Tensor, got %s" % type(x_local).__name__)
    if not isinstance(dim, int) or not -x_local.ndim <= dim < x_local.ndim:
        raise ValueError("dim: %r is not a dimension of x_local (%d dimensions)" % (dim, x_local.ndim))
    _ulysses_degree(ulysses)
    from ._autograd import UnshardFunction
    return UnshardFunction.apply(x_local, dim, layout, causal, comm, ulysses)


def _unshard(x_local, dim, layout, causal, comm, ulysses):
    import torch
    ctx = _context(comm)
    P = ctx.size()
    moved = x_local.detach().movedim(dim, 0).contiguous().cpu()
    # Every rank's shape and dtype first, so that a mismatch is an error on every rank.
    info = torch.zeros(10, dtype=torch.int64)
    info[0] = moved.ndim
    info[1:1 + moved.ndim] = torch.tensor(moved.shape, dtype=torch.int64) if moved.ndim <= 8 else 0
    info[9] = _zlib.crc32(str(moved.dtype).encode())  # the same on every rank, unlike hash()
    everyone = torch.empty(P, 10, dtype=torch.int64)
    ctx.allgather_bytes(info.data_ptr(), 80, everyone.data_ptr(), [80] * P)
    rows = everyone[:, 1].tolist()
    for r in range(P):
        same = everyone[r, 0] == everyone[0, 0] and bool((everyone[r, 2:] == everyone[0, 2:]).all())
        if not same:
            raise ValueError("x_local: rank %d's shape or dtype differs from rank 0's (beyond dim %d)" % (r, dim))
    L = sum(rows)
    layout_ = _layout_name(layout)
    expected = [len(p) for p in (ctx.positions(L, bool(causal), layout_, r, ulysses) for r in range(P))]
    if expected != rows:
        raise ValueError("x_local: the ranks hold %s rows along dim %d, but the layout gives %s for %d positions"
                         % (rows, dim, expected, L))
    row_bytes = moved[0].numel() * moved.element_size() if moved.shape[0] else 0
    gathered = torch.empty((L,) + tuple(moved.shape[1:]), dtype=moved.dtype)
    ctx.allgather_bytes(moved.data_ptr(), moved.numel() * moved.element_size(), gathered.data_ptr(),
                        [n * row_bytes for n in rows])
    whole = torch.empty_like(gathered)
    start = 0
    for r in range(P):
        pos = torch.tensor(ctx.positions(L, bool(causal), layout_, r, ulysses), dtype=torch.int64)
        whole[pos] = gathered[start:start + rows[r]]
        start += rows[r]
    return whole.movedim(0, dim).to(x_local.device)


def attention(q, k, v, *, causal=False, window=(-1, -1), doc_lens=None, block_mask=None, mask_block=128,
              softmax_scale=None, layout=None, schedule="direct", return_lse=False, comm=None, bigbird=None, seed=0,
              ulysses=1):
    """Exact attention of this rank's queries against every visible key of every rank.

    q (B, L_local, H, D), k and v (B, L_local, Hkv, D): this rank's rows (ringattn.shard), float32
    or bfloat16, any strides. Returns o (q's shape and dtype), and lse (B, H, L_local) float32 with
    return_lse=True. Differentiable for torch tensors; NumPy arrays (float32) are forward only.
    bigbird=(GLOBAL, WINDOW, RANDOM) with seed generates a BigBird block mask of mask_block blocks.
    ulysses=U (hybrid parallelism): an all-to-all inside groups of U consecutive ranks swaps
    sequence for heads and the ring runs across the groups. U divides the ranks and the heads H
    (and divides Hkv or is a multiple of it); the rows a rank holds change with U: take them with
    shard(..., ulysses=U). The results equal those of ulysses=1 to fp32 rounding.
    CUDA tensors (builds with CUDA) run on the CUDA backend with NCCL, ordered on the device with
    torch's current stream (after the kernels that wrote q, k, v; no device-wide sync).
    """
    device = "cuda" if getattr(q, "is_cuda", False) else "cpu"
    ctx = _context(comm, device)
    problem = _attention_error(q, k, v, device)
    spec = None
    if problem is None:
        problem, args = _mask_args(causal, window, doc_lens, block_mask, mask_block, softmax_scale, layout, schedule,
                                   return_lse, bigbird, seed, ulysses)
        if problem is None:
            spec = _ringattn.make_spec(*args)
    if problem is not None:  # every rank raises: the others learn of it in the agreement
        ctx.fail(problem[1], problem[1] + ": " + problem[2], problem[0] is TypeError)
    B, L, H, D = (int(n) for n in q.shape)
    shard_ = (B, L, H, int(k.shape[2]), D, _is_bf16(q))
    if _is_numpy(q):
        return _numpy_forward(ctx, shard_, spec, q, k, v, return_lse)
    import torch
    from ._autograd import RingAttentionFunction
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        o, lse = RingAttentionFunction.apply(q, k, v, ctx, shard_, spec)
    else:
        o, lse = _torch_forward(ctx, shard_, spec, q, k, v)[:2]
    return (o, lse) if return_lse else o


def _cuda_stream(x):
    """torch's current CUDA stream on x's device (an integer cudaStream_t) for a CUDA tensor, else None."""
    if not x.is_cuda:
        return None
    import torch
    return torch.cuda.current_stream(x.device).cuda_stream


def _torch_forward(ctx, shard_, spec, q, k, v):
    """o (q's dtype), lse, and what backward needs: the contiguous inputs and o in float32."""
    import torch
    q, k, v = q.detach().contiguous(), k.detach().contiguous(), v.detach().contiguous()
    o32 = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    lse = torch.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32, device=q.device)
    ctx.forward(shard_, spec, q.data_ptr(), k.data_ptr(), v.data_ptr(), o32.data_ptr(), lse.data_ptr(),
                _cuda_stream(q))
    o = o32 if q.dtype == torch.float32 else o32.to(q.dtype)
    return o, lse, q, k, v, o32


def _numpy_forward(ctx, shard_, spec, q, k, v, return_lse):
    import numpy
    q, k, v = (numpy.ascontiguousarray(x) for x in (q, k, v))
    o = numpy.empty(q.shape, dtype=numpy.float32)
    lse = numpy.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=numpy.float32)
    ctx.forward(shard_, spec, q.ctypes.data, k.ctypes.data, v.ctypes.data, o.ctypes.data, lse.ctypes.data, None)
    return (o, lse) if return_lse else o
