"""Attention over variable-length sequences packed along one token axis (FlashAttention's "varlen" layout).

Sequence s of a call occupies tokens [cu_seqlens[s], cu_seqlens[s + 1]) of the packed query and key/value arrays.
This is the segment-ids path of dot_product_attention seen from the other side: the offsets become one segment id
and one in-sequence position per token, so the same kernels (and their skipping of tiles no query of a sequence
can see) serve both layouts.
"""

from __future__ import annotations

import jax.numpy as jnp

from .attention import dot_product_attention


def varlen_attention(query, key, value, cu_seqlens_q, cu_seqlens_k, *, scale=None, is_causal: bool = False,
                     local_window_size=None, softcap=None, implementation=None):
    """Attention within each of several sequences packed along the token axis.

    Args:
      query: [total_q, heads_q, head_dim], the query tokens of every sequence, one after the other.
      key, value: [total_k, heads_kv, head_dim], likewise (heads_q a multiple of heads_kv).
      cu_seqlens_q, cu_seqlens_k: int32 [num_sequences + 1], non-decreasing offsets starting at 0: sequence s has
        query tokens [cu_seqlens_q[s], cu_seqlens_q[s + 1]) and keys [cu_seqlens_k[s], cu_seqlens_k[s + 1]). Tokens
        past the last offset are padding: their outputs are 0 and no query sees them.
      scale, is_causal, local_window_size, softcap, implementation: as in dot_product_attention, with positions
        counted from each sequence's start (causal is top-left aligned within a sequence, as in jax.nn).

    Returns:
      [total_q, heads_q, head_dim], typed like query.
    """
    for name, x in (("query", query), ("key", key), ("value", value)):
        if getattr(x, "ndim", None) != 3:
            raise ValueError(f"{name} must have shape [total_tokens, heads, head_dim], got "
                             f"{getattr(x, 'shape', type(x).__name__)}")
    for name, offsets in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if getattr(offsets, "ndim", None) != 1 or offsets.shape[0] < 2:
            raise ValueError(f"{name} must be a 1-D array of num_sequences + 1 >= 2 offsets, got "
                             f"{getattr(offsets, 'shape', type(offsets).__name__)}")
        if not jnp.issubdtype(offsets.dtype, jnp.integer):
            raise TypeError(f"{name} must hold integers, got dtype {offsets.dtype}")
    if cu_seqlens_q.shape != cu_seqlens_k.shape:
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must describe the same number of sequences, got shapes "
                         f"{cu_seqlens_q.shape} and {cu_seqlens_k.shape}")
    # Padding tokens get different ids on the two sides, so padded queries and padded keys never pair up.
    q_ids, q_positions = _segments(cu_seqlens_q, query.shape[0], padding_id=-1)
    k_ids, k_positions = _segments(cu_seqlens_k, key.shape[0], padding_id=-2)
    out = dot_product_attention(query[None], key[None], value[None], scale=scale, is_causal=is_causal,
                                local_window_size=local_window_size, softcap=softcap, implementation=implementation,
                                segment_ids=(q_ids[None], k_ids[None]),
                                segment_positions=(q_positions[None], k_positions[None]))
    return out[0]


def _segments(cu_seqlens, total: int, padding_id: int):
    """Each token's sequence index and position within its sequence; padding_id and 0 past the last offset."""
    offsets = jnp.asarray(cu_seqlens, jnp.int32)
    token = jnp.arange(total, dtype=jnp.int32)
    # Sequence s covers [offsets[s], offsets[s + 1]): the last offset <= token, which skips empty sequences.
    sequence = jnp.searchsorted(offsets, token, side="right").astype(jnp.int32) - 1
    inside = token < offsets[-1]
    sequence = jnp.clip(sequence, 0, offsets.shape[0] - 2)
    return jnp.where(inside, sequence, padding_id), jnp.where(inside, token - offsets[sequence], 0)
