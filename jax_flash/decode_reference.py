"""Pure-JAX decode with the exact semantics of jax_flash.decode_attention, computed in float32 (float64 when given
float64). It gathers the whole cache, so it is for tests and baselines, not for speed."""

from __future__ import annotations

import jax.numpy as jnp


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
    compute_dtype = jnp.promote_types(query.dtype, jnp.float32)
    batch, q_len, heads_q, head_dim = query.shape
    max_len, heads_kv = key_cache.shape[1], key_cache.shape[2]
    group = heads_q // heads_kv
    q = query.astype(compute_dtype).reshape(batch, q_len, heads_kv, group, head_dim)
    k = key_cache.astype(compute_dtype)
    v = value_cache.astype(compute_dtype)

    logits = jnp.einsum("bqhgd,bkhd->bhgqk", q, k) * scale
    if softcap > 0:
        logits = softcap * jnp.tanh(logits / softcap)
    lengths = jnp.clip(jnp.asarray(cache_lengths, jnp.int32), 0, max_len)
    positions = (lengths[:, None] - q_len + jnp.arange(q_len)[None, :])[:, :, None]  # [B, q_len, 1]
    keys = jnp.arange(max_len)[None, None, :]
    visible = keys <= positions
    if window_left >= 0:
        visible &= keys >= positions - window_left
    logits = jnp.where(visible[:, None, None], logits, -jnp.inf)

    row_max = jnp.max(logits, axis=-1, keepdims=True)
    safe_max = jnp.where(jnp.isfinite(row_max), row_max, 0)
    weights = jnp.exp(logits - safe_max)
    row_sum = jnp.sum(weights, axis=-1, keepdims=True)
    probs = weights / jnp.where(row_sum > 0, row_sum, 1)
    out = jnp.einsum("bhgqk,bkhd->bqhgd", probs, v).reshape(query.shape).astype(query.dtype)
    if not return_lse:
        return out
    lse = jnp.where(row_sum > 0, jnp.log(jnp.where(row_sum > 0, row_sum, 1)) + safe_max, -jnp.inf)
    return out, lse[..., 0].reshape(batch, heads_q, q_len).astype(jnp.float32)
