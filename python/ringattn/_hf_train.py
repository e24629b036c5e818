"""Training a transformers model on ringattn: this rank's part of a batch, the batch's loss from
the ranks' shares, and the gradients summed over the ranks (ringattn.hf re-exports these)."""
import numpy
import torch

from ._core import shard


def _mpi_comm(comm):
    from mpi4py import MPI
    return MPI, (MPI.COMM_WORLD if comm is None else comm)


def _documents_of(position_ids):
    """The documents' boundaries of the whole sequence (positions restarting at 0 at each document,
    as a packing collator gives them), the same for every batch row; None for one document."""
    rows = []
    for row in position_ids.to("cpu", torch.int64):
        starts = [0] + ((row[1:] - row[:-1]) != 1).nonzero().flatten().add(1).tolist()
        if bool((row[starts] != 0).any()):
            raise ValueError("position_ids: expected 0, 1, 2, ... in each document, restarting at 0 at the next one "
                             "(as DataCollatorWithFlattening gives them)")
        rows.append(starts + [row.numel()])
    if any(r != rows[0] for r in rows):
        raise ValueError("position_ids: the batch rows hold different documents: ringattn takes one set of documents "
                         "for the whole batch (pack them into one row, B = 1)")
    return rows[0] if len(rows[0]) > 2 else None


def shard_batch(input_ids, labels=None, position_ids=None, *, ignore_index=-100, causal=True, layout=None, comm=None,
                ulysses=1):
    """This rank's part of a whole batch, as the keyword arguments of the model call:
    ``model(**ringattn.hf.shard_batch(ids)).loss`` is this rank's share of the batch's mean loss
    (the shares sum to it: reduce_loss), and its backward gives this rank's share of the gradients
    (all_reduce_gradients sums them).

    input_ids (B, L): the whole batch, the same on every rank. labels (B, L): input_ids unless
    given; shifted by one (each row's label is the next token's, ignore_index at the end) before
    sharding, as transformers' causal-LM loss shifts the whole sequence; so the shifted labels go
    in as ``shift_labels`` and the model does not shift them again. position_ids: None for one
    document per row (global positions 0..L-1); for packed documents, positions restarting at 0 at
    each document (as transformers' DataCollatorWithFlattening gives them): the documents'
    boundaries are added as ``cu_seq_lens_q``/``cu_seq_lens_k``, and RoPE turns at each
    document's own positions. layout, comm and ulysses: as ringattn.shard (they are passed on to
    the model's attention as ringattn_layout, ringattn_comm, ringattn_ulysses)."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.ndim != 2:
        raise ValueError("input_ids: expected a (B, L) tensor of token ids, the whole batch")
    B, L = input_ids.shape
    if labels is None:
        labels = input_ids
    if tuple(labels.shape) != (B, L):
        raise ValueError("labels: shape %s differs from input_ids' %s" % (tuple(labels.shape), (B, L)))
    shifted = torch.nn.functional.pad(labels[:, 1:], (0, 1), value=ignore_index)
    if position_ids is None:
        position_ids = torch.arange(L, device=input_ids.device)[None]
    elif position_ids.ndim == 1:
        position_ids = position_ids[None]
    if position_ids.shape[-1] != L or position_ids.shape[0] not in (1, B):
        raise ValueError("position_ids: shape %s: expected (B, L) or (L,), L = %d" % (tuple(position_ids.shape), L))
    where = dict(layout=layout, causal=causal, comm=comm, ulysses=ulysses)
    local_labels = shard(shifted, dim=1, **where)
    batch = {
        "input_ids": shard(input_ids, dim=1, **where),
        "position_ids": shard(position_ids, dim=1, **where),
        "labels": local_labels,
        "shift_labels": local_labels,
        "num_items_in_batch": int((shifted != ignore_index).sum()),
        "use_cache": False,
    }
    bounds = _documents_of(position_ids)
    if bounds is not None:
        cu = torch.tensor(bounds, dtype=torch.int32, device=input_ids.device)
        longest = int(max(b - a for a, b in zip(bounds, bounds[1:])))
        batch.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=longest, max_length_k=longest)
    for name in ("layout", "comm"):
        if where[name] is not None:
            batch["ringattn_" + name] = where[name]
    if ulysses != 1:
        batch["ringattn_ulysses"] = ulysses
    return batch


def reduce_loss(loss, tokens=None, comm=None):
    """The batch's loss, the same float on every rank: the sum of the ranks' losses, each rank's
    share of the batch's mean (shard_batch gives them so); or, with tokens=N, each rank's loss a
    mean over its own N tokens, the ranks' weighted by their tokens. For logging: the backward
    goes through each rank's own loss."""
    MPI, comm = _mpi_comm(comm)
    value = float(loss.detach())
    both = numpy.array([value if tokens is None else value * tokens, 0.0 if tokens is None else tokens])
    comm.Allreduce(MPI.IN_PLACE, both, op=MPI.SUM)
    return float(both[0] if tokens is None else both[0] / both[1])


def all_reduce_gradients(parameters, comm=None, bucket_elements=1 << 22):
    """Sums each parameter's gradient over the ranks, in place, so that every rank holds the
    gradient of the whole batch and takes the same optimizer step. parameters: a module or an
    iterable of parameters, the same on every rank. A parameter no rank has a gradient for is
    left without one; one that only some ranks have, the others take as zeros. CUDA gradients
    are staged through host memory; DDP and FSDP do this themselves but average instead of
    summing (README, "With Hugging Face models")."""
    MPI, comm = _mpi_comm(comm)
    params = list(parameters.parameters() if isinstance(parameters, torch.nn.Module) else parameters)
    params = [p for p in params if p.requires_grad]
    have = numpy.array([p.grad is not None for p in params], dtype=numpy.int32)
    comm.Allreduce(MPI.IN_PLACE, have, op=MPI.MAX)
    grads = []
    for p, any_rank in zip(params, have.tolist()):
        if any_rank and p.grad is None:
            p.grad = torch.zeros_like(p)
        if any_rank:
            grads.append(p.grad)
    # Buckets of gradients flattened into float64 or float32 host buffers (bfloat16 has no MPI type).
    bucket, size = [], 0
    for i, g in enumerate(grads):
        bucket.append(g)
        size += g.numel()
        if size >= bucket_elements or i == len(grads) - 1:
            _sum_bucket(MPI, comm, bucket)
            bucket, size = [], 0


def _sum_bucket(MPI, comm, grads):
    dtype = torch.float64 if all(g.dtype == torch.float64 for g in grads) else torch.float32
    flat = torch.cat([g.detach().reshape(-1).to("cpu", dtype) for g in grads])
    comm.Allreduce(MPI.IN_PLACE, flat.numpy(), op=MPI.SUM)
    start = 0
    for g in grads:
        g.copy_(flat[start:start + g.numel()].reshape(g.shape))
        start += g.numel()
