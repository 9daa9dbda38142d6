"""What the linen and nnx self-attention layers share: their head layout, the attention between projections, and
the step of autoregressive decoding with a KV cache."""

from __future__ import annotations

import jax.numpy as jnp

from jax_flash.attention import dot_product_attention
from jax_flash.decode import decode_attention, update_kv_cache
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
    if positions is None and use_rotary:
        positions = jnp.arange(query.shape[-3]) if segment_positions is None else segment_positions
    query, key = _rotate(query, key, positions, use_rotary, rope_base)
    return dot_product_attention(query, key, value, is_causal=is_causal, local_window_size=local_window_size,
                                 softcap=softcap, segment_ids=segment_ids, segment_positions=segment_positions,
                                 query_seq_lengths=seq_lengths, key_value_seq_lengths=seq_lengths)


def attend_cached(query, key, value, cached_key, cached_value, cache_lengths, positions, *, is_causal,
                  local_window_size, softcap, use_rotary, rope_base, **per_token):
    """One step of autoregressive decoding: the new tokens' key/value [batch, new, kv_heads, head_dim] are written
    into the caches [batch, max_length, kv_heads, head_dim] after each row's cache_lengths [batch] int32 entries,
    then the new queries attend to everything cached so far (causal among themselves).

    Returns (out, cached_key, cached_value, cache_lengths + new). With use_rotary the default positions are each
    row's cache length onwards. Raises for a layer that is not causal and for the per-token masks of packed
    sequences, which a cache of one sequence per row does not take.
    """
    if not is_causal:
        raise ValueError("decode=True needs a causal layer (is_causal=True): each new token attends to the cached "
                         "tokens before it")
    given = [name for name, value in per_token.items() if value is not None]
    if given:
        raise ValueError(f"{', '.join(given)} cannot be used with decode=True: the cache holds one sequence per "
                         f"batch row, and its length is the cache's own count")
    new = query.shape[1]
    if positions is None and use_rotary:
        positions = cache_lengths[:, None] + jnp.arange(new, dtype=cache_lengths.dtype)
    query, key = _rotate(query, key, positions, use_rotary, rope_base)
    cached_key, cached_value = update_kv_cache(cached_key, cached_value, key.astype(cached_key.dtype),
                                               value.astype(cached_value.dtype), cache_lengths)
    cache_lengths = cache_lengths + new
    out = decode_attention(query.astype(cached_key.dtype), cached_key, cached_value, cache_lengths,
                           local_window_size=local_window_size, softcap=softcap)
    return out, cached_key, cached_value, cache_lengths


def _rotate(query, key, positions, use_rotary, rope_base):
    """Query and key rotated by positions when use_rotary; positions given without rotary are an error."""
    if use_rotary:
        return apply_rotary(query, positions, rope_base), apply_rotary(key, positions, rope_base)
    if positions is not None:
        raise ValueError("positions are only used by rotary embeddings; construct the layer with use_rotary=True "
                         "(segment_positions are the positions that causal and window masks compare)")
    return query, key
