"""jax_flash: FlashAttention for JAX, as XLA FFI custom calls with CPU and CUDA kernels."""

from jax_flash import _ffi
from jax_flash.attention import dot_product_attention
from jax_flash.info import build_info
from jax_flash.reference import attention_reference

__all__ = ["dot_product_attention", "attention_reference", "build_info"]
__version__ = "0.1.0"
