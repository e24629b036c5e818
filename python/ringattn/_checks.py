"""The checks the package makes on this rank before anything moves: types only (what a tensor is,
its dtype, device and rank, what kind of value an argument holds). Values (window sides, the
softmax scale, the layout, how heads divide, ...) are the library's to judge, on every rank alike;
it names them by their keywords. A problem is returned as (exception class, argument, message);
the caller makes every rank raise it (the agreement)."""


def comm_handle(comm):
    """The MPI_Comm of an mpi4py communicator as an integer; 0 for None (MPI_COMM_WORLD)."""
    if comm is None:
        return 0
    try:
        from mpi4py import MPI
    except ImportError:
        raise TypeError("comm: expected None or an mpi4py communicator (mpi4py is not installed)")
    if not isinstance(comm, MPI.Comm) or not isinstance(comm, MPI.Intracomm):
        raise TypeError("comm: expected None or an mpi4py intracommunicator, got %s" % type(comm).__name__)
    if comm == MPI.COMM_NULL:
        raise ValueError("comm: MPI.COMM_NULL")
    handle = MPI._handleof(comm)
    return 0 if comm == MPI.COMM_WORLD and handle == MPI._handleof(MPI.COMM_WORLD) else handle


def _module(x):
    return type(x).__module__.split(".")[0]


# Element types the compiled half takes, by the name it knows them by (float16: CUDA tensors).
_TORCH_DTYPES = {"torch.float32": "float32", "torch.bfloat16": "bfloat16", "torch.float16": "float16"}


def element_type(x):
    """The element type's name for the compiled half: "float32", "bfloat16" or "float16"."""
    return "float32" if _module(x) == "numpy" else _TORCH_DTYPES[str(x.dtype)]


def attention_error(q, k, v, device):
    names = ("q", "k", "v")
    kinds = [_module(x) for x in (q, k, v)]
    for name, x, kind in zip(names, (q, k, v), kinds):
        if kind not in ("torch", "numpy") or not hasattr(x, "shape"):
            return TypeError, name, "expected a torch.Tensor or numpy.ndarray, got %s" % type(x).__name__
    for name, kind in zip(names[1:], kinds[1:]):
        if kind != kinds[0]:
            return TypeError, name, "a %s while q is a %s: pass all three of one kind" % (kind, kinds[0])
    numpy_ = kinds[0] == "numpy"
    allowed = ("float32",) if numpy_ else tuple(_TORCH_DTYPES)
    for name, x in zip(names, (q, k, v)):
        if str(x.dtype) not in allowed:
            return TypeError, name, "dtype %s is not supported (%s)" % (x.dtype, ", ".join(allowed))
        if str(x.dtype) != str(q.dtype):
            return TypeError, name, "dtype %s differs from q's %s" % (x.dtype, q.dtype)
        if not numpy_ and x.device.type != device:
            return ValueError, name, "on device %s but q is on %s" % (x.device, q.device)
        if x.ndim != 4:
            shape = "(B, L_local, H, D)" if name == "q" else "(B, L_local, Hkv, D)"
            return ValueError, name, "expected 4 dimensions %s, got shape %s" % (shape, tuple(x.shape))
    # One shard is made of the three tensors: k and v must have one shape, and q's B, L_local, D.
    if tuple(k.shape) != tuple(v.shape):
        return ValueError, "v", "shape %s differs from k's %s" % (tuple(v.shape), tuple(k.shape))
    B, L, _, D = (int(n) for n in q.shape)
    if int(k.shape[0]) != B or int(k.shape[1]) != L or int(k.shape[3]) != D:
        return ValueError, "k", ("shape %s does not match q's %s: expected (B, L_local, Hkv, D) with q's B, "
                                 "L_local and D" % (tuple(k.shape), tuple(q.shape)))
    return None


def _is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


def _int_list(x):
    if _module(x) in ("torch", "numpy"):
        x = x.tolist()
    return [int(n) for n in x]


def spec_args(causal, window, doc_lens, block_mask, mask_block, softmax_scale, layout, schedule, return_lse,
              bigbird, seed, ulysses=1, kernel="auto", deterministic=False):
    """(None, arguments of _ringattn.make_spec) or (problem, None)."""
    if not isinstance(causal, bool):
        return (TypeError, "causal", "expected a bool, got %s" % type(causal).__name__), None
    if window is None:
        window = (-1, -1)
    if not (isinstance(window, (tuple, list)) and len(window) == 2 and all(_is_int(w) for w in window)):
        return (TypeError, "window", "expected (LEFT, RIGHT) integers, -1 for unbounded, got %r" % (window,)), None
    try:
        docs = [] if doc_lens is None else _int_list(doc_lens)
    except (TypeError, ValueError):
        return (TypeError, "doc_lens", "expected a sequence of document lengths"), None
    if not _is_int(mask_block):
        return (TypeError, "mask_block", "expected an int, got %r" % (mask_block,)), None
    mask_bytes = b""
    if block_mask is not None:
        if _module(block_mask) not in ("torch", "numpy"):
            return (TypeError, "block_mask", "expected a tensor or array of bool/uint8, got %s"
                    % type(block_mask).__name__), None
        # It crosses over flattened: its shape is the package's to check (the library counts entries).
        if block_mask.ndim != 2 or block_mask.shape[0] != block_mask.shape[1]:
            return (ValueError, "block_mask", "expected a square (n, n) array, n = ceil(L / mask_block), got shape %s"
                    % (tuple(block_mask.shape),)), None
        mask_bytes = bytes(1 if x else 0 for x in block_mask.reshape(-1).tolist())
    if bigbird is not None:
        if not (isinstance(bigbird, (tuple, list)) and len(bigbird) == 3 and all(_is_int(b) for b in bigbird)):
            return (TypeError, "bigbird", "expected (GLOBAL, WINDOW, RANDOM) integers, got %r" % (bigbird,)), None
        bigbird = tuple(bigbird)
    if not _is_int(seed) or seed < 0:  # (an unsigned integer where it crosses over)
        return (TypeError, "seed", "expected an integer >= 0, got %r" % (seed,)), None
    scale = 0.0
    if softmax_scale is not None:
        if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)):
            return (TypeError, "softmax_scale", "expected None or a number, got %r" % (softmax_scale,)), None
        if softmax_scale == 0:  # the library's 0 is None here
            return (ValueError, "softmax_scale", "0 is not a scale (None: 1/sqrt(head_dim))"), None
        scale = float(softmax_scale)
    if layout is not None and not isinstance(layout, str):
        return (TypeError, "layout", "expected None or a str, got %s" % type(layout).__name__), None
    if not isinstance(schedule, str):
        return (TypeError, "schedule", "expected a str, got %s" % type(schedule).__name__), None
    if not isinstance(return_lse, bool):
        return (TypeError, "return_lse", "expected a bool, got %s" % type(return_lse).__name__), None
    if not _is_int(ulysses):
        return (TypeError, "ulysses", "expected an int, got %s" % type(ulysses).__name__), None
    if not isinstance(kernel, str):
        return (TypeError, "kernel", "expected a str, got %s" % type(kernel).__name__), None
    if not isinstance(deterministic, bool):
        return (TypeError, "deterministic", "expected a bool, got %s" % type(deterministic).__name__), None
    return None, (causal, int(window[0]), int(window[1]), docs, mask_bytes, mask_block, bigbird, seed, scale,
                  layout or "", schedule, ulysses, kernel, deterministic)
