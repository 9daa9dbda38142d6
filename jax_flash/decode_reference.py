"""Pure-JAX decode with the exact semantics of jax_flash.decode_attention, computed in float32 (float64 when given
float64). It gathers the whole cache, so it is for tests and baselines, not for speed."""

from __future__ import annotations

import jax.numpy as jnp

from .reference import attention_reference


def contiguous_cache(cache, page_table):
    """The paged pool [num_pages, page_size, kv_heads, head_dim] seen through page_table [batch, pages_per_seq] as a
    contiguous cache [batch, pages_per_seq * page_size, kv_heads, head_dim] (page ids clamped like the kernels)."""
    pages = jnp.clip(page_table, 0, cache.shape[0] - 1)
    gathered = cache[pages]
    batch, pages_per_seq, page_size = gathered.shape[:3]
    return gathered.reshape(batch, pages_per_seq * page_size, *cache.shape[2:])


def decode_reference(query, key_cache, value_cache, cache_lengths, *, scale: float, window_left: int = -1,
                     softcap: float = 0.0, page_table=None, return_lse: bool = False):
    """query [B, q_len, Hq, D]; caches [B, max_len, Hkv, D] or, with page_table [B, pages_per_seq], pools
    [num_pages, page_size, Hkv, D]; cache_lengths [B] (clamped to [0, max_len]).

    Query i of sequence b sits at position p = cache_lengths[b] - q_len + i and sees keys j with
    p - window_left <= j <= p (window_left < 0: unbounded). Rows that see no key give 0 (lse -inf). Returns out in
    query's dtype, and lse [B, Hq, q_len] float32 when return_lse.
    """
    if page_table is not None:
        key_cache, value_cache = contiguous_cache(key_cache, page_table), contiguous_cache(value_cache, page_table)
    # The decode mask is attention's with each query at its cache position: keys j <= p (window_right 0), at most
    # window_left behind; keys past a length are behind every query of that sequence, so they stay hidden.
    q_len, max_len = query.shape[1], key_cache.shape[1]
    lengths = jnp.clip(jnp.asarray(cache_lengths, jnp.int32), 0, max_len)
    q_positions = lengths[:, None] - q_len + jnp.arange(q_len, dtype=jnp.int32)[None, :]
    kv_positions = jnp.arange(max_len, dtype=jnp.int32)[None, :]
    return attention_reference(query, key_cache, value_cache, scale=scale, window_left=window_left, window_right=0,
                               softcap=softcap, return_lse=return_lse, q_positions=q_positions,
                               kv_positions=kv_positions)
