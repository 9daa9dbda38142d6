"""jax_flash's self-attention layer for flax.linen."""

from __future__ import annotations

import functools
from typing import Any

import jax.numpy as jnp

from jax_flash.flax._dependency import import_flax
from jax_flash.flax.self_attention import attend, attend_cached, head_layout

nn = import_flax("flax.linen")


class Attention(nn.Module):
    """Self-attention on [batch, seq, features] -> [batch, seq, features], run by jax_flash's kernels.

    Separate query, key, value and output projections (params 'query', 'key', 'value', 'out', as in
    nn.MultiHeadDotProductAttention), num_kv_heads < num_heads for grouped-query attention (key/value heads are
    shared, never repeated in memory), the kernels' causal / local-window masks and logit soft-capping, and optional
    rotary position embeddings (see jax_flash.flax.rotary) on queries and keys.

    Attributes:
      num_heads: query heads.
      num_kv_heads: key/value heads, a divisor of num_heads; default num_heads.
      head_dim: features per head; default features // num_heads.
      is_causal, local_window_size, softcap: as in jax_flash.dot_product_attention.
      use_rotary: rotate queries and keys by their positions; rope_base: the rotary base wavelength.
      use_bias: biases in the four projections.
      dtype: the computation dtype (default: inferred from inputs and params); param_dtype: the params' dtype.
      decode: autoregressive decoding with a KV cache (as in nn.MultiHeadDotProductAttention), for causal layers.
        The cache lives in the "cache" collection (cached_key, cached_value [batch, max_length, kv_heads, head_dim]
        and cache_lengths [batch] int32): `init` on inputs [batch, max_length, features] sizes it (that call
        attends as without decode), then each call appends its inputs [batch, new, features] -- a prompt chunk or
        one token -- to every row's cache and attends to all of it, with apply(..., mutable=["cache"]). Runs on
        jax_flash.decode_attention and update_kv_cache; rotary positions default to each row's cache length on.
    """

    num_heads: int
    num_kv_heads: int | None = None
    head_dim: int | None = None
    is_causal: bool = False
    local_window_size: int | tuple[int, int] | None = None
    softcap: float | None = None
    use_rotary: bool = False
    rope_base: float = 10000.0
    use_bias: bool = False
    dtype: Any = None
    param_dtype: Any = jnp.float32
    decode: bool = False

    @nn.compact
    def __call__(self, inputs, positions=None, *, segment_ids=None, segment_positions=None, seq_lengths=None):
        """inputs [batch, seq, features]; positions [batch, seq] or [seq] for the rotary embeddings (default
        segment_positions, else 0..seq-1). Packed sequences: segment_ids [batch, seq] int32 (tokens attend within
        their segment), segment_positions [batch, seq] int32 (the positions causal / window masks compare), and
        padding: seq_lengths [batch] int32, as in jax_flash.dot_product_attention."""
        features = inputs.shape[-1]
        num_kv_heads, head_dim = head_layout(features, self.num_heads, self.num_kv_heads, self.head_dim)
        projection = functools.partial(nn.DenseGeneral, use_bias=self.use_bias, dtype=self.dtype,
                                       param_dtype=self.param_dtype)
        query = projection((self.num_heads, head_dim), name="query")(inputs)
        key = projection((num_kv_heads, head_dim), name="key")(inputs)
        value = projection((num_kv_heads, head_dim), name="value")(inputs)
        masks = dict(is_causal=self.is_causal, local_window_size=self.local_window_size, softcap=self.softcap,
                     use_rotary=self.use_rotary, rope_base=self.rope_base)
        per_token = dict(segment_ids=segment_ids, segment_positions=segment_positions, seq_lengths=seq_lengths)
        cache_ready = self.decode and self.has_variable("cache", "cached_key")
        if self.decode:  # created on the first (init) call, from the inputs' shape: [batch, max_length, ...]
            cached_key = self.variable("cache", "cached_key", jnp.zeros, key.shape, key.dtype)
            cached_value = self.variable("cache", "cached_value", jnp.zeros, value.shape, value.dtype)
            cache_lengths = self.variable("cache", "cache_lengths", jnp.zeros, inputs.shape[:1], jnp.int32)
        if cache_ready:
            out, cached_key.value, cached_value.value, cache_lengths.value = attend_cached(
                query, key, value, cached_key.value, cached_value.value, cache_lengths.value, positions, **masks,
                **per_token)
        else:
            out = attend(query, key, value, positions, **masks, **per_token)
        return projection(features, axis=(-2, -1), name="out")(out)
