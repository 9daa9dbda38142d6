"""Pure-JAX attention with the exact semantics of jax_flash's kernels, computed in float32 (or float64 when given
float64). It materialises the S x S logits, so it is for tests and for implementation='xla', not for long sequences.
"""

from __future__ import annotations

import jax.numpy as jnp


def attention_reference(query, key, value, *, scale: float, window_left: int = -1, window_right: int = -1,
                        softcap: float = 0.0, return_lse: bool = False, q_lengths=None, kv_lengths=None,
                        q_segment_ids=None, kv_segment_ids=None, q_positions=None, kv_positions=None):
    """query [B, Sq, Hq, D], key/value [B, Sk, Hkv, D] with Hq a multiple of Hkv.

    Query i sees key j when pi - window_left <= pj <= pi + window_right (negative bound: unbounded), where pi and pj
    are q_positions[b, i] and kv_positions[b, j] when given, else i and j; and, for those given, when
    i < q_lengths[b], j < kv_lengths[b] and q_segment_ids[b, i] == kv_segment_ids[b, j] (lengths [B], query
    segment ids and positions [B, Sq], key/value ones [B, Sk]). Rows that see no key give 0 (and lse -inf).
    Returns out in query's dtype, and lse [B, Hq, Sq] float32 when return_lse.
    """
    compute_dtype = jnp.promote_types(query.dtype, jnp.float32)
    batch, seq_q, heads_q, head_dim = query.shape
    seq_k, heads_kv = key.shape[1], key.shape[2]
    group = heads_q // heads_kv
    q = query.astype(compute_dtype).reshape(batch, seq_q, heads_kv, group, head_dim)
    k = key.astype(compute_dtype)
    v = value.astype(compute_dtype)

    logits = jnp.einsum("bqhgd,bkhd->bhgqk", q, k) * scale
    if softcap > 0:
        logits = softcap * jnp.tanh(logits / softcap)
    # visible is [B or 1, Sq, Sk].
    rows = jnp.arange(seq_q, dtype=jnp.int32)[None, :, None]
    cols = jnp.arange(seq_k, dtype=jnp.int32)[None, None, :]
    row_pos = rows if q_positions is None else q_positions[:, :, None]
    col_pos = cols if kv_positions is None else kv_positions[:, None, :]
    visible = jnp.ones((1, seq_q, seq_k), bool)
    if window_left >= 0:
        visible &= col_pos >= row_pos - window_left
    if window_right >= 0:
        visible &= col_pos <= row_pos + window_right
    if q_lengths is not None:
        visible &= rows < q_lengths[:, None, None]
    if kv_lengths is not None:
        visible &= cols < kv_lengths[:, None, None]
    if q_segment_ids is not None:
        visible &= q_segment_ids[:, :, None] == kv_segment_ids[:, None, :]
    logits = jnp.where(visible[:, None, None], logits, -jnp.inf)

    row_max = jnp.max(logits, axis=-1, keepdims=True)
    safe_max = jnp.where(jnp.isfinite(row_max), row_max, 0)
    weights = jnp.exp(logits - safe_max)
    row_sum = jnp.sum(weights, axis=-1, keepdims=True)
    probs = weights / jnp.where(row_sum > 0, row_sum, 1)
    out = jnp.einsum("bhgqk,bkhd->bqhgd", probs, v).reshape(batch, seq_q, heads_q, head_dim).astype(query.dtype)
    if not return_lse:
        return out
    lse = jnp.where(row_sum > 0, jnp.log(jnp.where(row_sum > 0, row_sum, 1)) + safe_max, -jnp.inf)
    return out, lse[..., 0].reshape(batch, heads_q, seq_q).astype(jnp.float32)
