"""jax_flash's self-attention layer for flax.nnx."""

from __future__ import annotations

import functools

import jax.numpy as jnp

from jax_flash.flax._dependency import import_flax
from jax_flash.flax.self_attention import attend, attend_cached, head_layout

nnx = import_flax("flax.nnx")


class Attention(nnx.Module):
    """Self-attention on [batch, seq, in_features] -> [batch, seq, in_features], run by jax_flash's kernels.

    The nnx twin of jax_flash.flax.linen.Attention (same arguments, same computation): separate query, key, value
    and out projections (nnx.LinearGeneral, as in nnx.MultiHeadAttention), grouped-query attention when num_kv_heads
    < num_heads, the kernels' causal / local-window masks and soft-capping, optional rotary position embeddings.

    Autoregressive decoding (causal layers), as in nnx.MultiHeadAttention: `init_cache((batch, max_length,
    in_features), dtype)` makes the KV cache (nnx.Cache variables), then each call with decode=True appends its
    inputs [batch, new, in_features] -- a prompt chunk or one token -- to every row's cache and attends to all of
    it, on jax_flash.decode_attention and update_kv_cache.
    """

    def __init__(self, in_features: int, num_heads: int, *, num_kv_heads: int | None = None,
                 head_dim: int | None = None, is_causal: bool = False,
                 local_window_size: int | tuple[int, int] | None = None, softcap: float | None = None,
                 use_rotary: bool = False, rope_base: float = 10000.0, use_bias: bool = False, dtype=None,
                 param_dtype=jnp.float32, rngs: nnx.Rngs):
        num_kv_heads, head_dim = head_layout(in_features, num_heads, num_kv_heads, head_dim)
        projection = functools.partial(nnx.LinearGeneral, use_bias=use_bias, dtype=dtype, param_dtype=param_dtype,
                                       rngs=rngs)
        self.query = projection(in_features, (num_heads, head_dim))
        self.key = projection(in_features, (num_kv_heads, head_dim))
        self.value = projection(in_features, (num_kv_heads, head_dim))
        self.out = projection((num_heads, head_dim), in_features, axis=(-2, -1))
        self.is_causal = is_causal
        self.local_window_size = local_window_size
        self.softcap = softcap
        self.use_rotary = use_rotary
        self.rope_base = rope_base
        self.num_kv_heads, self.head_dim = num_kv_heads, head_dim
        # Data (pytree leaves), not static attributes, though None until init_cache, as in nnx.MultiHeadAttention.
        self.cached_key, self.cached_value, self.cache_lengths = nnx.data(None), nnx.data(None), nnx.data(None)

    def init_cache(self, input_shape, dtype=jnp.float32):
        """An empty KV cache for inputs of shape [batch, max_length, in_features]: cached_key and cached_value
        [batch, max_length, num_kv_heads, head_dim] in dtype, and cache_lengths [batch] int32 (0)."""
        batch, max_length = input_shape[:2]
        self.cached_key = nnx.Cache(jnp.zeros((batch, max_length, self.num_kv_heads, self.head_dim), dtype))
        self.cached_value = nnx.Cache(jnp.zeros((batch, max_length, self.num_kv_heads, self.head_dim), dtype))
        self.cache_lengths = nnx.Cache(jnp.zeros((batch,), jnp.int32))

    def __call__(self, inputs, positions=None, *, segment_ids=None, segment_positions=None, seq_lengths=None,
                 decode: bool = False):
        """inputs [batch, seq, in_features]; positions, segment_ids, segment_positions and seq_lengths as in
        jax_flash.flax.linen.Attention; decode=True appends inputs to the cache made by init_cache and attends to
        it (see the class docstring)."""
        query, key, value = self.query(inputs), self.key(inputs), self.value(inputs)
        masks = dict(is_causal=self.is_causal, local_window_size=self.local_window_size, softcap=self.softcap,
                     use_rotary=self.use_rotary, rope_base=self.rope_base)
        per_token = dict(segment_ids=segment_ids, segment_positions=segment_positions, seq_lengths=seq_lengths)
        if not decode:
            return self.out(attend(query, key, value, positions, **masks, **per_token))
        if self.cached_key is None:
            raise ValueError("decode=True needs a KV cache: call init_cache((batch, max_length, in_features)) first")
        out, self.cached_key[...], self.cached_value[...], self.cache_lengths[...] = attend_cached(
            query, key, value, self.cached_key[...], self.cached_value[...], self.cache_lengths[...], positions,
            **masks, **per_token)
        return self.out(out)
