"""Flax integration of jax_flash.

* `attention_fn` / `make_attention_fn(...)`: drop-in `attention_fn` for flax.linen.MultiHeadDotProductAttention and
  flax.nnx.MultiHeadAttention (pure JAX; usable without importing flax).
* `jax_flash.flax.linen.Attention` / `jax_flash.flax.nnx.Attention`: self-attention layers with grouped-query
  attention, causal / sliding-window masks, soft-capping, rotary embeddings, packed sequences, and a decode mode
  that generates through a KV cache (jax_flash.decode_attention).

The layer modules import flax when first used, so `import jax_flash.flax` itself does not need flax.
"""

from __future__ import annotations

import importlib

from jax_flash.flax.attention_function import attention_fn, make_attention_fn
from jax_flash.flax.rotary import apply_rotary

__all__ = ["attention_fn", "make_attention_fn", "apply_rotary", "linen", "nnx"]

_LAYER_MODULES = ("linen", "nnx")


def __getattr__(name: str):
    # Lets `jax_flash.flax.linen.Attention` work after a plain `import jax_flash.flax`, importing flax only then.
    if name in _LAYER_MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
