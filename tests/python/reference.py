"""Dense PyTorch attention for the tests: the docs/reference.md mask as an (L, L) tensor, and attention in
any float dtype through it (the fp64 oracle and the same-precision yardstick)."""
import math

import torch


def dense_mask(L, causal=False, window=(-1, -1), doc_lens=None, block_mask=None, mask_block=128):
    i = torch.arange(L)[:, None]
    j = torch.arange(L)[None, :]
    visible = torch.ones(L, L, dtype=torch.bool)
    if causal:
        visible &= j <= i
    if window[0] >= 0:
        visible &= j >= i - window[0]
    if window[1] >= 0:
        visible &= j <= i + window[1]
    if doc_lens is not None:
        doc = torch.repeat_interleave(torch.arange(len(doc_lens)), torch.tensor(doc_lens))
        visible &= doc[:, None] == doc[None, :]
    if block_mask is not None:
        visible &= block_mask.bool()[i // mask_block, j // mask_block]
    return visible


def attention(q, k, v, visible, scale=None):
    """q (B, L, H, D), k and v (B, L, Hkv, D) -> o (B, L, H, D); rows that see no key give 0."""
    H, Hkv, D = q.shape[2], k.shape[2], q.shape[3]
    k = k.repeat_interleave(H // Hkv, dim=2)
    v = v.repeat_interleave(H // Hkv, dim=2)
    s = torch.einsum("blhd,bmhd->bhlm", q, k) * (scale if scale else 1.0 / math.sqrt(D))
    s = s.masked_fill(~visible, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # a row with no visible key: all -inf -> NaN -> 0
    return torch.einsum("bhlm,bmhd->blhd", p, v)
