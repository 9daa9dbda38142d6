"""A small decoder-only transformer over bytes (pre-norm blocks, learned positions) in flax.linen."""

from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax.numpy as jnp


class Block(nn.Module):
    num_heads: int
    attention_fn: Callable
    dtype: Any

    @nn.compact
    def __call__(self, x):
        features = x.shape[-1]
        # Flax's own attention layer; only the attention_fn inside it changes between implementations.
        x = x + nn.MultiHeadDotProductAttention(num_heads=self.num_heads, attention_fn=self.attention_fn,
                                                dtype=self.dtype, name="attention")(nn.LayerNorm(dtype=self.dtype)(x))
        hidden = nn.Dense(4 * features, dtype=self.dtype, name="mlp_in")(nn.LayerNorm(dtype=self.dtype)(x))
        return x + nn.Dense(features, dtype=self.dtype, name="mlp_out")(nn.gelu(hidden))


class DecoderLM(nn.Module):
    """tokens [batch, seq] int -> next-token logits [batch, seq, vocab_size] in float32."""

    vocab_size: int
    max_len: int
    features: int
    num_layers: int
    num_heads: int
    attention_fn: Callable
    dtype: Any = jnp.float32  # the computation dtype; params stay float32

    @nn.compact
    def __call__(self, tokens):
        embed = nn.Embed(self.vocab_size, self.features, dtype=self.dtype, name="embed")
        positions = self.param("positions", nn.initializers.normal(0.02), (self.max_len, self.features))
        x = embed(tokens) + positions[:tokens.shape[-1]].astype(self.dtype)
        for i in range(self.num_layers):
            x = Block(self.num_heads, self.attention_fn, self.dtype, name=f"block_{i}")(x)
        x = nn.LayerNorm(dtype=self.dtype)(x)
        return embed.attend(x).astype(jnp.float32)  # output projection tied to the embedding
