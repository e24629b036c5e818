"""The checks ringattn.attention makes on this rank before anything moves. A problem is returned as
(exception class, argument, message); the caller makes every rank raise it (the agreement)."""


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


def dtype_name(x):
    return str(x.dtype)


def is_bf16(x):
    return _module(x) == "torch" and str(x.dtype) == "torch.bfloat16"


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
    allowed = ("float32",) if numpy_ else ("torch.float32", "torch.bfloat16")
    for name, x in zip(names, (q, k, v)):
        if str(x.dtype) not in allowed:
            return TypeError, name, "dtype %s is not supported (%s)" % (x.dtype, " or ".join(allowed))
        if str(x.dtype) != str(q.dtype):
            return TypeError, name, "dtype %s differs from q's %s" % (x.dtype, q.dtype)
        if not numpy_ and x.device.type != device:
            return ValueError, name, "on device %s but q is on %s" % (x.device, q.device)
        if not numpy_ and device == "cpu" and x.device.type != "cpu":
            return ValueError, name, "device %s: CPU tensors only in this build" % x.device
        if x.ndim != 4:
            shape = "(B, L_local, H, D)" if name == "q" else "(B, L_local, Hkv, D)"
            return ValueError, name, "expected 4 dimensions %s, got shape %s" % (shape, tuple(x.shape))
    B, L, H, D = (int(n) for n in q.shape)
    if tuple(k.shape) != tuple(v.shape):
        return ValueError, "v", "shape %s differs from k's %s" % (tuple(v.shape), tuple(k.shape))
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


def mask_args(causal, window, doc_lens, block_mask, mask_block, softmax_scale, layout, schedule, return_lse,
              bigbird, seed, ulysses=1):
    """(None, arguments of _ringattn.make_spec) or (problem, None)."""
    if not isinstance(causal, bool):
        return (TypeError, "causal", "expected a bool, got %s" % type(causal).__name__), None
    if window is None:
        window = (-1, -1)
    if not (isinstance(window, (tuple, list)) and len(window) == 2 and all(_is_int(w) for w in window)):
        return (ValueError, "window", "expected (LEFT, RIGHT) integers, -1 for unbounded, got %r" % (window,)), None
    if min(window) < -1:
        return (ValueError, "window", "%r: sides must be >= 0, or -1 for unbounded" % (tuple(window),)), None
    try:
        docs = [] if doc_lens is None else _int_list(doc_lens)
    except (TypeError, ValueError):
        return (TypeError, "doc_lens", "expected a sequence of document lengths"), None
    if not _is_int(mask_block) or mask_block < 1:
        return (ValueError, "mask_block", "expected a positive integer, got %r" % (mask_block,)), None
    mask_bytes = b""
    if block_mask is not None:
        if _module(block_mask) not in ("torch", "numpy") or block_mask.ndim != 2:
            return (ValueError, "block_mask", "expected a 2-D tensor or array of bool/uint8 (n, n), n = ceil(L / "
                    "mask_block)"), None
        if block_mask.shape[0] != block_mask.shape[1]:
            return (ValueError, "block_mask", "expected a square array, got shape %s" % (tuple(block_mask.shape),)), None
        flat = block_mask.reshape(-1).tolist()
        mask_bytes = bytes(1 if x else 0 for x in flat)
    if bigbird is not None:
        if not (isinstance(bigbird, (tuple, list)) and len(bigbird) == 3 and all(_is_int(b) for b in bigbird)):
            return (ValueError, "bigbird", "expected (GLOBAL, WINDOW, RANDOM) integers, got %r" % (bigbird,)), None
        bigbird = tuple(bigbird)
    if not _is_int(seed) or seed < 0:
        return (ValueError, "seed", "expected an integer >= 0, got %r" % (seed,)), None
    scale = 0.0
    if softmax_scale is not None:
        if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)) or not softmax_scale > 0 \
                or softmax_scale == float("inf"):
            return (ValueError, "softmax_scale", "expected None or a finite positive number, got %r"
                    % (softmax_scale,)), None
        scale = float(softmax_scale)
    if layout is not None and layout not in ("contiguous", "zigzag", "striped"):
        return (ValueError, "layout", "%r, expected None, 'contiguous', 'zigzag' or 'striped'" % (layout,)), None
    if schedule not in ("direct", "ring"):
        return (ValueError, "schedule", "%r, expected 'direct' or 'ring'" % (schedule,)), None
    if not isinstance(return_lse, bool):
        return (TypeError, "return_lse", "expected a bool, got %s" % type(return_lse).__name__), None
    # Whether U divides the ranks and the heads is checked with every rank's shapes (the agreement).
    if not _is_int(ulysses):
        return (TypeError, "ulysses", "expected an int, got %s" % type(ulysses).__name__), None
    if ulysses < 1:
        return (ValueError, "ulysses", "%d: expected an integer >= 1 (1: the ring alone)" % ulysses), None
    return None, (causal, int(window[0]), int(window[1]), docs, mask_bytes, mask_block, bigbird, seed, scale,
                  layout or "", schedule, ulysses)
