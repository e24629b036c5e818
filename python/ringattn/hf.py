"""Hugging Face transformers on ringattn: ``import ringattn.hf`` registers the attention implementation
``"ringattn"``, so that a model made with ``attn_implementation="ringattn"`` and called under mpirun
with this rank's rows computes exact attention over the whole sequence (docs/reference.md,
"Hugging Face transformers"; the README, "With Hugging Face models").

It goes through transformers' public registries, ``AttentionInterface`` and
``AttentionMaskInterface`` (https://huggingface.co/docs/transformers/attention_interface), not
through the library's private functions. The model calls ``attention(module, query, key, value,
attention_mask, scaling, dropout, sliding_window, **kwargs)`` with q, k, v of this rank's rows as
(B, H, S_local, D), RoPE already applied at the rows' global positions (``position_ids``); it gets
back ((B, S_local, H, D), None).

The training helpers: ``shard_batch`` (this rank's part of a whole batch, labels shifted before
sharding), ``reduce_loss`` (the loss of the whole batch from every rank's share) and
``all_reduce_gradients`` (the gradients of the whole batch on every rank).
"""
import torch
from transformers import AttentionInterface, AttentionMaskInterface

from . import attention as _ring_attention
from ._core import context as _context
from ._hf_docs import documents as _documents
from ._hf_train import all_reduce_gradients, reduce_loss, shard_batch

__all__ = ["attention", "shard_batch", "reduce_loss", "all_reduce_gradients"]

def _refuse(ctx, argument, message):
    """Every rank raises ValueError naming the argument: this one now, the others when the ring's
    next agreement learns of it (their attention call)."""
    ctx.fail(argument, "{%s}: %s" % (argument, message), False)


def window_of(sliding_window, causal):
    """ringattn's (LEFT, RIGHT) window for a layer's ``sliding_window``, with the boundary of
    transformers' eager masks: causal layers see the key when q_idx - kv_idx < sliding_window (the
    query and the W - 1 keys before it), bidirectional ones when |q_idx - kv_idx| <= sliding_window."""
    if sliding_window is None:
        return (-1, -1)
    w = int(sliding_window)
    return (w - 1, 0) if causal else (w, w)


def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, sliding_window=None, softcap=None,
              s_aux=None, **kwargs):
    """transformers' attention interface on ringattn (see the module's docstring). Keyword arguments
    of the model call, which the model passes on, choose where and how the ring runs: ringattn_comm
    (an mpi4py communicator; None: every rank), ringattn_layout (None: zigzag when causal, as
    ringattn.shard) and ringattn_ulysses (the Ulysses degree)."""
    comm = kwargs.get("ringattn_comm")
    layout = kwargs.get("ringattn_layout")
    ulysses = kwargs.get("ringattn_ulysses", 1)
    ctx = _context(comm, "cuda" if query.is_cuda else "cpu")
    causal = kwargs.get("is_causal")
    causal = bool(module.is_causal if causal is None else causal)
    # First what every rank finds together (the documents: agreed, or raised on every rank), then
    # what this rank alone may find (refused on every rank by the ring's agreement).
    doc_lens = _documents(ctx, kwargs, query.shape[2], layout, causal, ulysses)
    if dropout:  # the model passes 0.0 when not training
        _refuse(ctx, "dropout", "attention dropout %g in training is not supported by ringattn (set "
                "config.attention_dropout = 0.0)" % dropout)
    if softcap is not None:
        _refuse(ctx, "softcap", "logit softcapping (attn_logit_softcapping %g) is not supported by ringattn" % softcap)
    if s_aux is not None or kwargs.get("sinks") is not None:
        _refuse(ctx, "s_aux", "attention sinks are not supported by ringattn")
    if attention_mask is not None:
        _refuse(ctx, "attention_mask", "an attention mask (padding, or one given whole) is not supported by ringattn: "
                "pack the sequences instead (position_ids restarting at 0 at each document, or cu_seq_lens_q)")
    if key.shape[2] != query.shape[2]:
        _refuse(ctx, "key", "%d keys for %d queries: ringattn attends over this rank's rows of one sequence, not a "
                "KV cache (call the model with use_cache=False)" % (key.shape[2], query.shape[2]))
    o = _ring_attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), causal=causal,
                        window=window_of(sliding_window, causal), doc_lens=doc_lens, softmax_scale=scaling,
                        layout=layout, comm=comm, ulysses=ulysses)
    return o, None


def mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None, attention_mask=None, **kwargs):
    """transformers' mask interface for "ringattn": no mask is built (ringattn makes its own from the
    layer and the positions); a 2D padding mask with padding is handed on, for attention() to refuse."""
    if attention_mask is not None and attention_mask.ndim == 2 and bool(attention_mask.all()):
        return None
    return attention_mask


AttentionInterface.register("ringattn", attention)
AttentionMaskInterface.register("ringattn", mask)
