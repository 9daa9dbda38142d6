"""Pure-JAX attention with the exact semantics of jax_flash's kernels, computed in float32 (or float64 when given
float64). It materialises the S x S logits, so it is for tests and for implementation='xla', not for long sequences.
"""

from __future__ import annotations

import jax.numpy as jnp


def attention_reference(query, key, value, *, scale: float, window_left: int = -1, window_right: int = -1,
                        softcap: float = 0.0, return_lse: bool = False):
    """query [B, Sq, Hq, D], key/value [B, Sk, Hkv, D] with Hq a multiple of Hkv.

    Query i sees key j when i - window_left <= j <= i + window_right (negative bound: unbounded). Rows that see no
    key give 0 (and lse -inf). Returns out in query's dtype, and lse [B, Hq, Sq] float32 when return_lse.
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
    rows = jnp.arange(seq_q)[:, None]
    cols = jnp.arange(seq_k)[None, :]
    visible = jnp.ones((seq_q, seq_k), bool)
    if window_left >= 0:
        visible &= cols >= rows - window_left
    if window_right >= 0:
        visible &= cols <= rows + window_right
    logits = jnp.where(visible, logits, -jnp.inf)

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
