"""Packed documents as transformers hands them to flash attention, as ringattn's doc_lens: either
cu_seq_lens_q (the documents' boundaries in the whole sequence, the same on every rank), or
position_ids restarting at 0 at each document (this rank's rows of them).

From position_ids alone a rank sees only its rows. A row at global position g with position p in
its document says that a document starts at g - p; the ranks gather these starts (a few numbers
per document, never the whole sequence's positions), and each checks its rows against them. The
result is kept for the next layers of the same forward pass (the model hands every layer the same
position_ids tensor), so that the ranks talk once per pass."""
import torch

_last = {}  # "key": what the documents were found from, "doc_lens": what was found


def documents(ctx, kwargs, rows, layout, causal, ulysses):
    """doc_lens for ringattn.attention (None: one document)."""
    cu = kwargs.get("cu_seq_lens_q")
    if cu is not None:
        return _from_boundaries(cu, kwargs.get("cu_seq_lens_k"))
    position_ids = kwargs.get("position_ids")
    if position_ids is None:
        return None
    key = (position_ids, position_ids._version, rows, layout, causal, ulysses, ctx)
    last = _last.get("key")
    if last is not None and last[0] is position_ids and last[6] is ctx and last[1:6] == key[1:6]:
        return _last["doc_lens"]
    doc_lens = _from_positions(ctx, position_ids, rows, layout, causal, ulysses)
    _last["key"], _last["doc_lens"] = key, doc_lens
    return doc_lens


def _from_boundaries(cu_q, cu_k):
    bounds = [int(b) for b in cu_q.reshape(-1).tolist()]
    if cu_k is not None and [int(b) for b in cu_k.reshape(-1).tolist()] != bounds:
        raise ValueError("cu_seq_lens_k: differs from cu_seq_lens_q (ringattn's documents are the same for queries "
                         "and keys)")
    if len(bounds) < 2 or bounds[0] != 0:
        raise ValueError("cu_seq_lens_q: expected the documents' boundaries in the whole sequence, 0 first, got %s"
                         % bounds[:8])
    # Their lengths (positive, summing to the sequence length) are the library's to judge.
    return [b - a for a, b in zip(bounds, bounds[1:])]


# Problems one rank finds in its position_ids, by number, so that every rank can name them.
_PROBLEMS = {
    1: "expected (B, S_local) or (S_local,): this rank's rows",
    2: "the batch rows differ: ringattn takes one set of documents for the whole batch (pack them into one row)",
    3: ("neither the rows' global positions (ringattn.positions) nor positions restarting at 0 at each document "
        "(ringattn.shard of the whole sequence's)"),
}


def _allgather_int64(ctx, values, counts):
    """Every rank's int64 values (counts[r] of rank r), concatenated in rank order."""
    send = torch.tensor(values, dtype=torch.int64)
    recv = torch.empty(sum(counts), dtype=torch.int64)
    ctx.allgather_bytes(send.data_ptr(), 8 * len(values), recv.data_ptr(), [8 * n for n in counts])
    return recv


def _raise_if_any(everyone, rank_of):
    """everyone[r] > 0: rank r found problem everyone[r]; every rank raises it, naming the rank."""
    bad = [(r, int(code)) for r, code in enumerate(everyone.tolist()) if code > 0]
    if bad:
        r, code = bad[0]
        raise ValueError("position_ids: %s (rank %d's)" % (_PROBLEMS[code], rank_of(r)))


def _from_positions(ctx, position_ids, rows, layout, causal, ulysses):
    P = ctx.size()
    p = position_ids.detach().to("cpu", torch.int64)
    if p.ndim == 1:
        p = p[None]
    problem = 0
    if p.ndim != 2 or p.shape[1] != rows:
        problem = 1
    elif p.shape[0] > 1 and not bool((p == p[:1]).all()):
        problem = 2
    # 1. Every rank's rows (the sequence length) and what it found so far.
    first = _allgather_int64(ctx, [rows, problem], [2] * P).view(P, 2)
    _raise_if_any(first[:, 1], lambda r: r)
    L = int(first[:, 0].sum())
    g = torch.tensor(ctx.positions(L, causal, layout or "", -1, ulysses), dtype=torch.int64)
    starts = g - p[0]
    problem = 3 if bool(((starts < 0) | (p[0] < 0)).any()) else 0
    mine = torch.unique(starts).tolist() if problem == 0 else []
    # 2. How many document starts each rank saw; 3. the starts.
    second = _allgather_int64(ctx, [problem, len(mine)], [2] * P).view(P, 2)
    _raise_if_any(second[:, 0], lambda r: r)
    union = torch.unique(_allgather_int64(ctx, mine, second[:, 1].tolist()))  # sorted
    if union.numel() == 0 or int(union[0]) != 0:  # the same on every rank: every rank raises
        raise ValueError("position_ids: no document starts at position 0: %s" % _PROBLEMS[3])
    # Each row's document starts at the last start at or before it: else the positions lie. 4. What
    # each rank found, so that every rank raises or none does (and every rank keeps the result for
    # the next layers, or none: their collectives stay in step).
    expected = union[torch.searchsorted(union, g, right=True) - 1]
    problem = 3 if rows and not bool((expected == starts).all()) else 0
    _raise_if_any(_allgather_int64(ctx, [problem], [1] * P), lambda r: r)
    if union.numel() == 1:
        return None
    bounds = union.tolist() + [L]
    return [b - a for a, b in zip(bounds, bounds[1:])]
