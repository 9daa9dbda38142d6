"""What the linen and nnx self-attention layers share: their head layout and the attention between projections."""

from __future__ import annotations

import jax.numpy as jnp

from jax_flash.attention import dot_product_attention
from jax_flash.flax.rotary import apply_rotary


def head_layout(features: int, num_heads: int, num_kv_heads: int | None, head_dim: int | None) -> tuple[int, int]:
    """(num_kv_heads, head_dim) with their defaults (num_heads; features // num_heads), checked."""
    if num_heads < 1:
        raise ValueError(f"num_heads must be positive, got {num_heads}")
    num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
    if num_kv_heads < 1 or num_heads % num_kv_heads:
        raise ValueError(f"num_kv_heads ({num_kv_heads}) must be a positive divisor of num_heads ({num_heads}): each "
                         f"key/value head serves a whole group of query heads")
    if head_dim is None:
        if features % num_heads:
            raise ValueError(f"features ({features}) is not a multiple of num_heads ({num_heads}); pass head_dim")
        head_dim = features // num_heads
    return num_kv_heads, head_dim


def attend(query, key, value, positions, *, is_causal, local_window_size, softcap, use_rotary, rope_base,
           segment_ids=None, segment_positions=None, seq_lengths=None):
    """Attention of projected query [batch, seq, heads, head_dim] and key/value [batch, seq, kv_heads, head_dim].

    With use_rotary, query and key are first rotated by positions (default: segment_positions when given, so that
    packed documents each start at position 0, else 0..seq-1 for every batch row). segment_ids and
    segment_positions ([batch, seq] int32) and seq_lengths ([batch] int32, for queries and keys alike) are those of
    jax_flash.dot_product_attention for self-attention.
    """
    if use_rotary:
        if positions is None:
            positions = jnp.arange(query.shape[-3]) if segment_positions is None else segment_positions
        query = apply_rotary(query, positions, rope_base)
        key = apply_rotary(key, positions, rope_base)
    elif positions is not None:
        raise ValueError("positions are only used by rotary embeddings; construct the layer with use_rotary=True "
                         "(segment_positions are the positions that causal and window masks compare)")
    return dot_product_attention(query, key, value, is_causal=is_causal, local_window_size=local_window_size,
                                 softcap=softcap, segment_ids=segment_ids, segment_positions=segment_positions,
                                 query_seq_lengths=seq_lengths, key_value_seq_lengths=seq_lengths)
