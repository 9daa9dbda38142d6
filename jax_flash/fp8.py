"""jax_flash.dot_product_attention_fp8: attention on float8_e4m3fn query, key and value with per-tensor scales, for
inference (forward only), returning bfloat16.

FP8 inference stores each tensor as x_fp8 = round(x / x_scale); the attention of the real values is then
softmax(scale * (query_scale q_fp8) (key_scale k_fp8)^T) (value_scale v_fp8).

How it runs: on an sm_90 GPU, at head dims that are multiples of 16 up to 128, the Hopper FP8 kernel computes
Q K^T and P V with e4m3 tensor-core products (P rounded to e4m3 after a lift by 256, the value first transposed in a
workspace), accumulating in float32. Elsewhere (the CPU, other GPUs and head dims, builds without it) the inputs are
dequantized by XLA -- the key exactly (every e4m3 value is a bfloat16 value), the query times query_scale *
key_scale and the value times value_scale, each rounded once to bfloat16 -- and jax_flash's bfloat16 kernels run.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.interpreters import ad

from jax_flash import _jax_internals, _validation
from jax_flash._primitives import attention_fp8_fwd_p, dequantize_fp8
from jax_flash.attention import IMPLEMENTATIONS, attention_config, dot_product_attention

FP8_DTYPES = (jnp.dtype(jnp.float8_e4m3fn),)


def _per_tensor_scale(name: str, x):
    """A scale as a float32 scalar. Traced values are allowed (they only multiply the inputs); concrete ones are
    also checked to be positive."""
    if isinstance(x, bool) or not isinstance(x, (int, float)) and not hasattr(x, "dtype"):
        raise TypeError(f"{name} must be a number or a scalar floating-point array, got {type(x).__name__}")
    if hasattr(x, "dtype"):
        if jnp.ndim(x) != 0:
            raise ValueError(f"{name} must be a scalar (one scale per tensor), got shape {jnp.shape(x)}")
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise TypeError(f"{name} must have a floating-point dtype, got {x.dtype}")
    if not isinstance(x, jax.core.Tracer) and not float(x) > 0:
        raise ValueError(f"{name} must be positive, got {x}")
    return jnp.asarray(x, jnp.float32)


FORWARD_ONLY = ("jax_flash.dot_product_attention_fp8 is forward-only (inference): it has no gradient; "
                "differentiate jax_flash.dot_product_attention on float32, float16 or bfloat16 inputs instead")


@jax.custom_vjp
def _forward_only(out):
    return out


def _forward_only_fwd(out):
    return out, None


def _forward_only_bwd(_, cotangent):
    raise TypeError(FORWARD_ONLY)


_forward_only.defvjp(_forward_only_fwd, _forward_only_bwd)


def _no_jvp(primals, tangents, *, config):
    raise TypeError(FORWARD_ONLY)


# The kernel path: differentiating through the primitive (any operand with a tangent, the scales included) raises.
ad.primitive_jvps[attention_fp8_fwd_p] = _no_jvp


def dot_product_attention_fp8(query, key, value, *, query_scale, key_scale, value_scale, scale=None,
                              is_causal: bool = False, query_seq_lengths=None, key_value_seq_lengths=None,
                              local_window_size=None, softcap=None, segment_ids=None, segment_positions=None,
                              implementation=None):
    """Attention on float8_e4m3fn query, key and value, each with a per-tensor scale; returns bfloat16.

    Args:
      query, key, value: float8_e4m3fn arrays shaped as for jax_flash.dot_product_attention.
      query_scale, key_scale, value_scale: the factors that turn each stored tensor back into real values
        (x = x_scale * x_fp8): positive Python numbers, or float scalar arrays (traced values are fine).
      scale, is_causal, query_seq_lengths, key_value_seq_lengths, local_window_size, softcap, segment_ids,
        segment_positions, implementation: as in jax_flash.dot_product_attention; `scale` multiplies the dot
        products of the real values.

    Returns:
      bfloat16 attention output shaped like query. Forward only: differentiating it raises a TypeError.

    On sm_90 GPUs the FP8 kernel runs where it applies; elsewhere the inputs are dequantized to bfloat16 and
    jax_flash's bfloat16 kernels run (see the module docstring).
    """
    _validation.check_qkv(query, key, value, dtypes=FP8_DTYPES)
    query_scale, key_scale, value_scale = (_per_tensor_scale(name, x) for name, x in (
        ("query_scale", query_scale), ("key_scale", key_scale), ("value_scale", value_scale)))
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
    if implementation == "xla":
        q, k, v = dequantize_fp8(query, key, value, query_scale * key_scale, value_scale)
        out = dot_product_attention(q, k, v, scale=scale, is_causal=is_causal,
                                    query_seq_lengths=query_seq_lengths, key_value_seq_lengths=key_value_seq_lengths,
                                    local_window_size=local_window_size, implementation="xla", softcap=softcap,
                                    segment_ids=segment_ids, segment_positions=segment_positions)
        return _forward_only(out)
    config, tokens = attention_config(query, key, scale=scale, is_causal=is_causal,
                                      query_seq_lengths=query_seq_lengths,
                                      key_value_seq_lengths=key_value_seq_lengths,
                                      local_window_size=local_window_size, softcap=softcap, segment_ids=segment_ids,
                                      segment_positions=segment_positions)
    unbatched = query.ndim == 3
    if unbatched:
        query, key, value = query[None], key[None], value[None]
    descale = jnp.stack([query_scale * key_scale, value_scale])
    query, key, value, descale, *token_arrays = _jax_internals.match_varying_axes(query, key, value, descale,
                                                                                  *tokens.values())
    out, _ = attention_fp8_fwd_p.bind(query, key, value, descale, *token_arrays, config=config)
    return out[0] if unbatched else out
