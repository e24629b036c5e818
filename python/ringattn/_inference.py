"""Inference against a KV cache sharded across the ranks (docs/reference.md "Inference"): ringattn.KVCache,
ringattn.prefill and ringattn.decode. CPU tensors, or CUDA tensors with a cache made with
device="cuda" (its rows then live on the rank's GPU); no autograd. The checks here are types and
shapes against the cache; the library judges the rest, on every rank alike, and a problem any
rank finds raises on every rank with the cache unchanged."""
from ._checks import element_type
from ._core import context, cuda_stream


class KVCache:
    """One layer's KV cache: `capacity` rows per sequence on each rank (its share of each of the
    `batch` sequences, never a whole one). A prefill's rows stay on the rank that computed them;
    decode's new tokens go round-robin in units of `interleave` tokens to the rank holding the
    fewest, so shares differ by at most one unit. device="cuda": the cache in this rank's GPU
    memory (the CUDA backend, NCCL between the ranks), taking CUDA tensors. Collective over comm."""

    def __init__(self, batch, kv_heads, head_dim, capacity, dtype=None, comm=None, interleave=1, device="cpu"):
        import torch
        dtype = torch.float32 if dtype is None else dtype
        if dtype not in (torch.float32, torch.bfloat16):
            raise TypeError("dtype: %s is not supported (torch.float32, torch.bfloat16)" % (dtype,))
        for name, x in (("batch", batch), ("kv_heads", kv_heads), ("head_dim", head_dim), ("capacity", capacity),
                        ("interleave", interleave)):
            if not isinstance(x, int) or isinstance(x, bool):
                raise TypeError("%s: expected an int, got %s" % (name, type(x).__name__))
        self.batch, self.kv_heads, self.head_dim, self.capacity = batch, kv_heads, head_dim, capacity
        device = torch.device(device).type if isinstance(device, (str, torch.device)) else device
        if device not in ("cpu", "cuda"):
            raise ValueError("device: %r: expected 'cpu' or 'cuda'" % (device,))
        self.dtype, self.comm, self.interleave, self.device = dtype, comm, interleave, device
        from . import _ringattn
        self._ctx = context(comm, device)
        self._cache = _ringattn.KVCache(self._ctx, batch, kv_heads, head_dim, capacity,
                                        "bfloat16" if dtype == torch.bfloat16 else "float32", interleave)

    def lengths(self):
        """Tokens cached per sequence: the whole sequence's, the same on every rank."""
        return list(self._cache.lengths())

    def rows(self, sequence, rank=-1):
        """Rows of a sequence a rank holds (default: this rank)."""
        return self._cache.rows(sequence, rank)

    def prefill_positions(self, tokens, method="auto", window=(-1, 0)):
        """Positions within a chunk of `tokens` new tokens of the rows this rank passes to prefill:
        its rows of the causal layout (as ringattn.shard(x, dim=1, causal=True)), or all of them
        for method="pass-q"."""
        return list(self._cache.prefill_positions(tokens, int(window[0]), method))


def _problem(q, k, v, cache, window):
    """(argument, message template, type error) for a problem found on this rank, or None."""
    import torch
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            return name, "{%s}: expected a torch.Tensor, got %s" % (name, type(x).__name__), True
        if x.dtype != cache.dtype:
            return name, "{%s}: dtype %s differs from the cache's %s" % (name, x.dtype, cache.dtype), True
        if x.device.type != cache.device:
            return name, "{%s}: on %s, but the cache is on %s" % (name, x.device, cache.device), False
        if x.ndim != 4:
            return name, "{%s}: expected 4 dimensions, got shape %s" % (name, tuple(x.shape)), False
        if torch.is_grad_enabled() and x.requires_grad:
            return name, "{%s} requires grad: prefill and decode have no autograd (run under torch.no_grad())" % name, False
    if tuple(k.shape) != tuple(v.shape):
        return "v", "{v}: shape %s differs from k's %s" % (tuple(v.shape), tuple(k.shape)), False
    B, L, H, D = (int(n) for n in q.shape)
    if B != cache.batch:
        return "q", "{q}: batch %d, but the cache holds %d sequences" % (B, cache.batch), False
    if int(k.shape[0]) != B or int(k.shape[1]) != L:
        return "k", "{k}: shape %s does not match q's %s in batch and rows" % (tuple(k.shape), tuple(q.shape)), False
    if int(k.shape[2]) != cache.kv_heads:
        return "k", "{k}: %d heads, but the cache holds %d" % (int(k.shape[2]), cache.kv_heads), False
    if D != cache.head_dim or int(k.shape[3]) != D:
        return "q", "{q}: head dim %d, but the cache's is %d" % (D, cache.head_dim), False
    if not isinstance(window, (tuple, list)) or len(window) != 2 or int(window[1]) not in (0, -1):
        return "window", "{window} %r: expected (LEFT, 0); attention against the cache is causal" % (window,), False
    return None


def _outputs(q):
    import torch
    B, L, H, _ = q.shape
    o = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    lse = torch.empty((B, H, L), dtype=torch.float32, device=q.device)
    return o, lse


def _pointers(q, k, v, cache, problem):
    if problem is not None:
        return (0, 0, 0), None
    q, k, v = (x.detach().contiguous() for x in (q, k, v))
    if q.is_cuda:  # the call's device work waits for torch's current stream, which then waits for it
        cache._ctx.set_cuda_stream(cuda_stream(q))
    return (q.data_ptr(), k.data_ptr(), v.data_ptr()), (q, k, v)


def prefill(q, k, v, cache, window=(-1, 0), method="auto"):
    """Attention (causal) of new tokens against the cache and themselves; their K/V are stored.

    q (B, rows, H, D), k and v (B, rows, Hkv, D): this rank's rows of the new tokens, as
    ringattn.shard(x, dim=1, causal=True) gives them of the chunk (cache.prefill_positions), for
    method "auto" and "pass-kv"; the whole chunk on every rank for method="pass-q". "auto" follows
    Meta's rule (pass-KV when T / (T + P) >= 2 Hkv / H or T is large, else pass-Q; it gathers the
    chunk itself when it picks pass-Q). Returns this rank's rows of o (q's shape and dtype)."""
    problem = _problem(q, k, v, cache, window)
    if problem is None and method not in ("auto", "pass-kv", "pass-q"):
        problem = ("method", "{method} %r: expected 'auto', 'pass-kv' or 'pass-q'" % (method,), False)
    ptrs, kept = _pointers(q, k, v, cache, problem)
    o, lse = _outputs(q) if problem is None else (None, None)
    heads = int(q.shape[2]) if problem is None else 1
    rows = int(q.shape[1]) if problem is None else 0
    cache._cache.prefill(heads, rows, int(window[0]) if problem is None else -1,
                         method if problem is None else "auto", *ptrs,
                         o.data_ptr() if o is not None else 0, lse.data_ptr() if lse is not None else 0, problem)
    return o if q.dtype == o.dtype else o.to(q.dtype)


def decode(q, k, v, cache, window=(-1, 0)):
    """T new tokens per sequence (usually 1; a few for speculative decoding) against the cache.

    q (B, T, H, D), k and v (B, T, Hkv, D): the same on every rank. Appends k, v to the cache
    (placed round-robin) and returns o (B, T, H, D), q's dtype, on every rank."""
    problem = _problem(q, k, v, cache, window)
    ptrs, kept = _pointers(q, k, v, cache, problem)
    o, lse = _outputs(q) if problem is None else (None, None)
    heads = int(q.shape[2]) if problem is None else 1
    tokens = int(q.shape[1]) if problem is None else 1
    cache._cache.decode(heads, tokens, int(window[0]) if problem is None else -1, *ptrs,
                        o.data_ptr() if o is not None else 0, lse.data_ptr() if lse is not None else 0, problem)
    return o if q.dtype == o.dtype else o.to(q.dtype)
