"""Masks as tensors, for references and plots: the BigBird block mask that attention(bigbird=...)
generates."""


def bigbird_block_mask(seq_len, global_blocks, window, random, mask_block=128, seed=0):
    """(n, n) bool tensor, n = ceil(seq_len / mask_block): the block mask of
    attention(bigbird=(global_blocks, window, random), mask_block=mask_block, seed=seed)."""
    import torch
    from . import _ringattn
    n = -(-seq_len // mask_block)
    # Counts beyond the number of blocks mean all of them, as in attention().
    raw = _ringattn.bigbird_block_mask(n, min(global_blocks, n), min(window, n), min(random, n), seed)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).reshape(n, n).bool()
