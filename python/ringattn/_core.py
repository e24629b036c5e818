"""The package's machinery below its API: the contexts (one per communicator, device and option
set), the positions a layout gives, sharding, and the compiled calls that autograd wraps
(_autograd.py). Nothing here imports the package's __init__."""
import atexit
import zlib

from . import _ringattn
from ._checks import comm_handle

_options = {"threads": 0, "timeout": 300.0}
_contexts = {}
_leaked = []


def configure(threads=None, timeout=None):
    """Options of the contexts created from now on: CPU threads per rank (0: the node's cores
    shared among its ranks) and the timeout in seconds after which a silent peer is an error."""
    if threads is not None:
        if not isinstance(threads, int) or isinstance(threads, bool):
            raise TypeError("threads: expected an int, got %s" % type(threads).__name__)
        _options["threads"] = threads
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise TypeError("timeout: expected a number of seconds, got %s" % type(timeout).__name__)
        _options["timeout"] = float(timeout)


def context(comm, device="cpu"):
    handle = comm_handle(comm)
    key = (handle, device, _options["threads"], _options["timeout"])
    ctx = _contexts.get(key)
    if ctx is None:  # collective over comm: every rank reaches here on the same call
        backend, transport = ("cuda", "nccl") if device == "cuda" else ("cpu", "mpi")
        ctx = _ringattn.Context(handle, backend, transport, _options["threads"], _options["timeout"])
        _contexts[key] = ctx
    return ctx


@atexit.register
def _release():
    # Contexts hold duplicates of MPI communicators: free them before MPI ends (after it, leave them).
    if _ringattn.mpi_finalized():
        _leaked.extend(_contexts.values())
    _contexts.clear()
    _ringattn.finalize()


def rank(comm=None):
    return _ringattn.comm_rank(comm_handle(comm))


def size(comm=None):
    return _ringattn.comm_size(comm_handle(comm))


def _check_int(name, x):
    if not isinstance(x, int) or isinstance(x, bool):
        raise TypeError("%s: expected an int, got %s" % (name, type(x).__name__))


def _check_layout(layout):
    if layout is not None and not isinstance(layout, str):
        raise TypeError("layout: expected None or a str, got %s" % type(layout).__name__)
    return layout or ""


def positions_list(seq_len, layout, causal, comm, rank_=-1, ulysses=1):
    _check_int("seq_len", seq_len)
    _check_int("ulysses", ulysses)
    return context(comm).positions(seq_len, bool(causal), _check_layout(layout), rank_, ulysses)


def positions(seq_len, layout=None, causal=False, comm=None, ulysses=1):
    """int64 global positions of this rank's rows (for RoPE and labels), as a torch tensor.
    ulysses: the degree attention() is called with (it changes which rows a rank holds)."""
    import torch
    return torch.tensor(positions_list(seq_len, layout, causal, comm, ulysses=ulysses), dtype=torch.int64)


def is_numpy(x):
    return type(x).__module__ == "numpy"


def _check_dim(name, x, dim):
    if not isinstance(dim, int) or not -x.ndim <= dim < x.ndim:
        raise ValueError("dim: %r is not a dimension of %s (%d dimensions)" % (dim, name, x.ndim))


def shard(x, dim=1, layout=None, causal=False, comm=None, ulysses=1):
    """This rank's rows of a whole tensor (or NumPy array) x along dim, in the layout's order
    (with ulysses=U, the layout's rows of each group of U ranks, split among its members)."""
    if not (is_numpy(x) or type(x).__module__.startswith("torch")):
        raise TypeError("x: expected a torch.Tensor or numpy.ndarray, got %s" % type(x).__name__)
    _check_dim("x", x, dim)
    pos = positions_list(int(x.shape[dim]), layout, causal, comm, ulysses=ulysses)
    if is_numpy(x):
        import numpy
        return numpy.take(x, pos, axis=dim)
    import torch
    return x.index_select(dim, torch.tensor(pos, dtype=torch.int64, device=x.device))


def check_unshard(x_local, dim, ulysses):
    import torch
    if not isinstance(x_local, torch.Tensor):
        raise TypeError("x_local: expected a torch.Tensor, got %s" % type(x_local).__name__)
    _check_dim("x_local", x_local, dim)
    _check_int("ulysses", ulysses)


def unshard_rows(x_local, dim, layout, causal, comm, ulysses):
    """The whole tensor from every rank's rows (no autograd: see _autograd.UnshardFunction)."""
    import torch
    ctx = context(comm)
    P = ctx.size()
    moved = x_local.detach().movedim(dim, 0).contiguous().cpu()
    # Every rank's shape and dtype first, so that a mismatch is an error on every rank.
    info = torch.zeros(10, dtype=torch.int64)
    info[0] = moved.ndim
    info[1:1 + moved.ndim] = torch.tensor(moved.shape, dtype=torch.int64) if moved.ndim <= 8 else 0
    info[9] = zlib.crc32(str(moved.dtype).encode())  # the same on every rank, unlike hash()
    everyone = torch.empty(P, 10, dtype=torch.int64)
    ctx.allgather_bytes(info.data_ptr(), 80, everyone.data_ptr(), [80] * P)
    rows = everyone[:, 1].tolist()
    for r in range(P):
        same = everyone[r, 0] == everyone[0, 0] and bool((everyone[r, 2:] == everyone[0, 2:]).all())
        if not same:
            raise ValueError("x_local: rank %d's shape or dtype differs from rank 0's (beyond dim %d)" % (r, dim))
    L = sum(rows)
    layout_ = _check_layout(layout)
    every_positions = [ctx.positions(L, bool(causal), layout_, r, ulysses) for r in range(P)]
    expected = [len(p) for p in every_positions]
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
        whole[torch.tensor(every_positions[r], dtype=torch.int64)] = gathered[start:start + rows[r]]
        start += rows[r]
    return whole.movedim(0, dim).to(x_local.device)


def cuda_stream(x):
    """torch's current CUDA stream on x's device (an integer cudaStream_t) for a CUDA tensor, else None."""
    if not x.is_cuda:
        return None
    import torch
    return torch.cuda.current_stream(x.device).cuda_stream


def torch_forward(ctx, shard_, spec, q, k, v):
    """o (q's dtype), lse, what backward needs (the contiguous inputs and o in float32), and the
    handle to what the forward kept for its backward."""
    import torch
    q, k, v = q.detach().contiguous(), k.detach().contiguous(), v.detach().contiguous()
    o32 = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    lse = torch.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32, device=q.device)
    stats = ctx.forward(shard_, spec, q.data_ptr(), k.data_ptr(), v.data_ptr(), o32.data_ptr(), lse.data_ptr(),
                        cuda_stream(q))
    o = o32 if q.dtype == torch.float32 else o32.to(q.dtype)
    return o, lse, q, k, v, o32, stats["saved"]


def numpy_forward(ctx, shard_, spec, q, k, v, return_lse):
    import numpy
    q, k, v = (numpy.ascontiguousarray(x) for x in (q, k, v))
    o = numpy.empty(q.shape, dtype=numpy.float32)
    lse = numpy.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=numpy.float32)
    ctx.forward(shard_, spec, q.ctypes.data, k.ctypes.data, v.ctypes.data, o.ctypes.data, lse.ctypes.data, None)
    return (o, lse) if return_lse else o
