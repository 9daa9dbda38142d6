"""The attention implementations the example can switch between, each as an `attention_fn` for Flax's layer.

The model is an ordinary flax.linen.MultiHeadDotProductAttention; switching it to jax_flash is the one argument
`attention_fn=jax_flash.flax.make_attention_fn(is_causal=True)`. The other two run jax.nn.dot_product_attention with
the same causal mask, so all three train the same model on the same params.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

import jax_flash.flax

IMPLEMENTATIONS = ("jax_flash", "xla", "cudnn")


def attention_fn(implementation: str):
    """Causal attention for flax.linen.MultiHeadDotProductAttention(attention_fn=...)."""
    if implementation == "jax_flash":
        return jax_flash.flax.make_attention_fn(is_causal=True)
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"unknown attention implementation {implementation!r}; choose from {IMPLEMENTATIONS}")

    # Flax passes only the keyword arguments named here; the layer gets no mask (causality is fixed) and no dropout.
    def jax_nn_attention(query, key, value, mask=None, dtype=None):
        if mask is not None:
            raise ValueError("the example's attention is causal by construction; the layer must not pass a mask")
        dtype = jnp.result_type(query, key, value) if dtype is None else dtype
        return jax.nn.dot_product_attention(query.astype(dtype), key.astype(dtype), value.astype(dtype),
                                            is_causal=True, implementation=implementation)

    return jax_nn_attention


def unavailable_reason(implementation: str, dtype) -> str | None:
    """Why `implementation` cannot run here (None when it can): cuDNN's attention needs an NVIDIA GPU and 16-bit
    inputs."""
    if implementation != "cudnn":
        return None
    if jax.default_backend() != "gpu":
        return f"cuDNN attention needs a GPU (the default backend is {jax.default_backend()})"
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return f"cuDNN attention needs bfloat16 or float16, not {jnp.dtype(dtype).name} (use --dtype bfloat16)"
    return None
