"""jax_flash: FlashAttention for JAX, as XLA FFI custom calls with CPU and CUDA kernels."""

from jax_flash import _ffi
from jax_flash.attention import dot_product_attention
from jax_flash.decode import decode_attention, update_kv_cache
from jax_flash.fp8 import dot_product_attention_fp8
from jax_flash._build_info import build_info
from jax_flash.reference import attention_reference
from jax_flash.ring import ring_attention, zigzag_permutation
from jax_flash.varlen import varlen_attention

__all__ = ["dot_product_attention", "dot_product_attention_fp8", "varlen_attention", "decode_attention",
           "update_kv_cache", "ring_attention", "zigzag_permutation", "attention_reference", "build_info"]
__version__ = "0.1.0"
