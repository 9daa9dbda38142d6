"""jax_flash.decode_attention and jax_flash.update_kv_cache: autoregressive decoding against a KV cache.

The cache is contiguous, [batch, max_len, kv_heads, head_dim], or paged: a pool [num_pages, page_size, kv_heads,
head_dim] shared by all sequences plus page_table [batch, pages_per_seq] int32, where sequence b keeps its position
j in page page_table[b, j // page_size] at row j % page_size. Both functions take either layout.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jax_flash import _validation
from jax_flash._config import AttentionConfig
from jax_flash._decode_partitioning import identity_page_table
from jax_flash._decode_primitives import decode_p, kv_cache_update_p
from jax_flash._primitives import MAX_HEAD_DIM

PAGE_SIZE_MULTIPLE = 16


def _check_array(name, x, ndim, what):
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(f"{name} must be an array, got {type(x).__name__}")
    if x.ndim != ndim:
        raise ValueError(f"{name} must have rank {ndim} {what}, got shape {x.shape}")


def _int32(name, x, shape, what):
    """x as int32 after checking it is an integer array of `shape`."""
    x = jnp.asarray(x) if isinstance(x, (list, tuple, np.ndarray)) else x
    _check_array(name, x, len(shape), what)
    if not jnp.issubdtype(x.dtype, jnp.integer):
        raise TypeError(f"{name} must have an integer dtype, got {x.dtype}")
    if x.shape != shape:
        raise ValueError(f"{name} must have shape {shape} {what}, got {x.shape}")
    return x.astype(jnp.int32)


def _concrete(x):
    """x as a numpy array when its value is known at trace time, else None."""
    try:
        return np.asarray(x)
    except jax.errors.ConcretizationTypeError:
        return None
    except jax.errors.TracerArrayConversionError:
        return None


def _check_range(name, x, low, high, meaning):
    values = _concrete(x)
    if values is not None and values.size and (values.min() < low or values.max() > high):
        raise ValueError(f"{name} must lie in [{low}, {high}] ({meaning}), got values in "
                         f"[{values.min()}, {values.max()}]")


def _cache_layout(key_cache, value_cache, page_table, batch, dtype_name):
    """Validates the caches and returns (page_table as int32 [batch, pages_per_seq], capacity per sequence)."""
    layout = "[num_pages, page_size, kv_heads, head_dim]" if page_table is not None else \
        "[batch, max_len, kv_heads, head_dim]"
    for name, x in (("key_cache", key_cache), ("value_cache", value_cache)):
        _check_array(name, x, 4, layout)
        _validation.check_dtype(name, x)
    if key_cache.shape != value_cache.shape:
        raise ValueError(f"key_cache and value_cache must have the same shape, got {key_cache.shape} and "
                         f"{value_cache.shape}")
    if key_cache.dtype != value_cache.dtype:
        raise TypeError(f"key_cache and value_cache must have the same dtype, got {key_cache.dtype} and "
                        f"{value_cache.dtype}")
    if 0 in key_cache.shape:
        raise ValueError(f"key_cache has a zero-length axis: shape {key_cache.shape}")
    if key_cache.shape[-1] > MAX_HEAD_DIM:
        raise ValueError(f"head_dim must be at most {MAX_HEAD_DIM}, got {key_cache.shape[-1]}")
    if page_table is None:
        if key_cache.shape[0] != batch:
            raise ValueError(f"key_cache must have the batch size of {dtype_name} ({batch}) in a contiguous cache "
                             f"[batch, max_len, kv_heads, head_dim], got shape {key_cache.shape}; pass page_table "
                             f"for a paged cache")
        return identity_page_table(batch), key_cache.shape[1]
    num_pages, page_size = key_cache.shape[:2]
    if page_size % PAGE_SIZE_MULTIPLE:
        raise ValueError(f"the page size (axis 1 of key_cache, shape {key_cache.shape}) must be a multiple of "
                         f"{PAGE_SIZE_MULTIPLE}, got {page_size}")
    if not hasattr(page_table, "shape"):
        page_table = jnp.asarray(page_table)
    if page_table.ndim != 2 or 0 in page_table.shape:
        raise ValueError(f"page_table must have shape [batch, pages_per_seq], got {page_table.shape}")
    table = _int32("page_table", page_table, (batch, page_table.shape[1]), "[batch, pages_per_seq]")
    _check_range("page_table", table, 0, num_pages - 1, f"page ids of a pool of {num_pages} pages")
    return table, page_table.shape[1] * page_size


def decode_attention(query, key_cache, value_cache, cache_lengths, *, scale=None, local_window_size=None,
                     softcap=None, page_table=None, return_lse: bool = False):
    """Attention of q_len new queries per sequence against a KV cache that already holds their keys and values.

    Args:
      query: [batch, q_len, heads, head_dim], q_len >= 1 (1 for plain decoding; more for speculative decoding or
        chunked prefill).
      key_cache, value_cache: [batch, max_len, kv_heads, head_dim], or with page_table the page pools
        [num_pages, page_size, kv_heads, head_dim] (page_size a multiple of 16); heads a multiple of kv_heads
        (GQA/MQA, each K/V head read once for all its query heads). Same dtype as query.
      cache_lengths: [batch] integers, the valid entries of each sequence including the q_len new ones (write them
        first with update_kv_cache). The queries sit at the end: query i at position cache_lengths[b] - q_len + i,
        seeing keys at positions <= its own (causal, bottom-right aligned). Entries past the length are never read.
        Lengths outside [0, max_len] raise where they are known at trace time and are clamped otherwise.
      scale: softmax scale, a concrete number; default 1/sqrt(head_dim).
      local_window_size: int w, or (left, right) as in jax.nn: a query at position p sees keys p - left <= j <= p
        (right is moot: decoding is causal).
      softcap: if > 0, logits s become softcap * tanh(s / softcap) before the softmax.
      page_table: [batch, pages_per_seq] integers, for the paged layout (capacity pages_per_seq * page_size). Page
        ids outside [0, num_pages) raise where known at trace time and are clamped otherwise.
      return_lse: also return the natural-log sum of exp of the logits, [batch, heads, q_len] float32.

    Returns:
      out shaped and typed like query (and lse when return_lse). A query that sees no key (a length of 0, or fewer
      valid entries than queries) gets 0 and lse -inf; one that sees a NaN gets NaN, as with jax.nn.
    """
    _check_array("query", query, 4, "[batch, q_len, heads, head_dim]")
    _validation.check_dtype("query", query)
    if 0 in query.shape:
        raise ValueError(f"query has a zero-length axis: shape {query.shape}")
    batch, _, heads_q, head_dim = query.shape
    table, capacity = _cache_layout(key_cache, value_cache, page_table, batch, "query")
    if key_cache.dtype != query.dtype:
        raise TypeError(f"query and the caches must have the same dtype, got {query.dtype} and {key_cache.dtype}")
    if key_cache.shape[-1] != head_dim:
        raise ValueError(f"query and the caches must have the same head_dim, got {head_dim} and "
                         f"{key_cache.shape[-1]}")
    if heads_q % key_cache.shape[2]:
        raise ValueError(f"the number of query heads ({heads_q}) must be a multiple of the number of kv heads "
                         f"({key_cache.shape[2]})")
    lengths = _int32("cache_lengths", cache_lengths, (batch,), "[batch]")
    _check_range("cache_lengths", lengths, 0, capacity, "the cache capacity per sequence")
    scale, softcap = _validation.scale_and_softcap(head_dim, scale, softcap)
    window_left, window_right = _validation.window_bounds(local_window_size, is_causal=True)
    config = AttentionConfig(scale, window_left, window_right, softcap)
    out, lse = decode_p.bind(query, key_cache, value_cache, lengths, table, config=config,
                             contiguous=page_table is None)
    return (out, lse) if return_lse else out


def update_kv_cache(key_cache, value_cache, new_k, new_v, positions, *, page_table=None):
    """Writes new keys and values into the cache, in place, and returns the updated (key_cache, value_cache).

    Args:
      key_cache, value_cache: as in decode_attention (contiguous, or page pools with page_table).
      new_k, new_v: [batch, new_len, kv_heads, head_dim] in the caches' dtype.
      positions: [batch] integers; sequence b's new rows go to positions positions[b] + t, t < new_len. Rows that
        fall outside the capacity (or on a page id outside the pool) raise where known at trace time and are
        dropped otherwise.
      page_table: [batch, pages_per_seq] integers, for the paged layout.

    The update is a custom call whose results alias the caches: under jit, donate the caches
    (donate_argnums) or carry them through a lax loop and no copy of the cache is made. Two sequences writing the
    same page slot in one call is a race.
    """
    _check_array("new_k", new_k, 4, "[batch, new_len, kv_heads, head_dim]")
    _validation.check_dtype("new_k", new_k)
    batch = new_k.shape[0]
    table, capacity = _cache_layout(key_cache, value_cache, page_table, batch, "new_k")
    expected = (batch, new_k.shape[1], *key_cache.shape[2:])
    for name, x in (("new_k", new_k), ("new_v", new_v)):
        _check_array(name, x, 4, "[batch, new_len, kv_heads, head_dim]")
        if x.shape != expected:
            raise ValueError(f"{name} must have shape {expected} [batch, new_len, kv_heads, head_dim] to match the "
                             f"cache, got {x.shape}")
        if x.dtype != key_cache.dtype:
            raise TypeError(f"{name} must have the caches' dtype {key_cache.dtype}, got {x.dtype}")
    positions = _int32("positions", positions, (batch,), "[batch]")
    _check_range("positions", positions, 0, capacity - new_k.shape[1],
                 f"so that all {new_k.shape[1]} new rows fit in the capacity {capacity}")
    return tuple(kv_cache_update_p.bind(key_cache, value_cache, new_k, new_v, positions, table,
                                        contiguous=page_table is None))
