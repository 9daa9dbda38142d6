"""jax_flash's self-attention layer for flax.linen."""

from __future__ import annotations

import functools
from typing import Any

import jax.numpy as jnp

from jax_flash.flax._dependency import import_flax
from jax_flash.flax.self_attention import attend, head_layout

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

    @nn.compact
    def __call__(self, inputs, positions=None, *, segment_ids=None, segment_positions=None, seq_lengths=None):
        """inputs [batch, seq, features]; positions [batch, seq] or [seq] for the rotary embeddings (default
        segment_positions, else 0..seq-1). Packed sequences: segment_ids [batch, seq] int32 (tokens attend within
        their segment), segment_positions [batch, seq] int32 (the positions causal / window masks compare), and
        padding: seq_lengths [batch] int32, as in jax_flash.dot_product_attention (CPU kernels only for now)."""
        features = inputs.shape[-1]
        num_kv_heads, head_dim = head_layout(features, self.num_heads, self.num_kv_heads, self.head_dim)
        projection = functools.partial(nn.DenseGeneral, use_bias=self.use_bias, dtype=self.dtype,
                                       param_dtype=self.param_dtype)
        query = projection((self.num_heads, head_dim), name="query")(inputs)
        key = projection((num_kv_heads, head_dim), name="key")(inputs)
        value = projection((num_kv_heads, head_dim), name="value")(inputs)
        out = attend(query, key, value, positions, is_causal=self.is_causal, local_window_size=self.local_window_size,
                     softcap=self.softcap, use_rotary=self.use_rotary, rope_base=self.rope_base,
                     segment_ids=segment_ids, segment_positions=segment_positions, seq_lengths=seq_lengths)
        return projection(features, axis=(-2, -1), name="out")(out)
