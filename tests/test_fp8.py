"""dot_product_attention_fp8: float8_e4m3fn inputs with per-tensor scales, against the float64 reference of the
dequantized values, plus its transformations and errors."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_testing as at
import jax_flash
from jax_flash._primitives import fp8_kernel_applies

E4M3_MAX = 448.0


def _quantized(rng, shape, platform, magnitude):
    """(x_fp8, scale) for standard-normal data times magnitude, scaled so that max|x| maps to e4m3's largest value."""
    x = magnitude * rng.standard_normal(shape)
    scale = float(np.max(np.abs(x))) / E4M3_MAX
    return at.put(jnp.asarray(x / scale, jnp.float8_e4m3fn), platform), scale


def _inputs(rng, platform, *, seq_q, seq_k, heads_q, heads_kv, head_dim, batch=2):
    q, q_scale = _quantized(rng, (batch, seq_q, heads_q, head_dim), platform, 1.0)
    k, k_scale = _quantized(rng, (batch, seq_k, heads_kv, head_dim), platform, 2.0)
    v, v_scale = _quantized(rng, (batch, seq_k, heads_kv, head_dim), platform, 0.5)
    return (q, k, v), dict(query_scale=q_scale, key_scale=k_scale, value_scale=v_scale)


def _real_values(qkv, scales):
    """The float64 values the fp8 inputs and their scales stand for."""
    return [np.asarray(x, np.float64) * scales[name] for x, name in zip(qkv, ("query_scale", "key_scale",
                                                                                "value_scale"))]


def _e4m3_probability_baseline(qkv, scales, mask):
    """Attention as an FP8 kernel computes it, in float64 but for two roundings: the probabilities, relative to their
    row's maximum and lifted by 256, rounded to e4m3 before P V (their sum stays exact), and the output rounded to
    bfloat16. The baseline the FP8 kernel's error is held to, as the bfloat16 XLA path is for the kernels that
    dequantize."""
    q, k, v = _real_values(qkv, scales)
    _, _, probs = at.numpy_probabilities(q, k, scale=1.0 / np.sqrt(q.shape[-1]), **mask)
    row_max = probs.max(axis=-1, keepdims=True)
    relative = probs / np.where(row_max > 0, row_max, 1.0)
    rounded = np.asarray(np.asarray(relative * 256.0, jnp.float8_e4m3fn), np.float64) / 256.0
    rounded_probs = rounded / np.maximum(relative.sum(axis=-1, keepdims=True), 1.0)
    out = np.einsum("bhgts,bshd->bthgd", rounded_probs, v, optimize=True)
    return jnp.asarray(out.reshape(q.shape), jnp.bfloat16)  # and rounded to the output's dtype, as the kernel does


@pytest.mark.parametrize("seq_q, seq_k, heads_q, heads_kv, head_dim, mask", [
    (17, 113, 4, 1, 64, dict()),
    (113, 113, 4, 2, 128, dict(is_causal=True)),
    (1, 1000, 2, 2, 80, dict()),
    (113, 17, 8, 2, 96, dict(local_window_size=(9, 3))),
    (64, 64, 2, 1, 32, dict(softcap=10.0)),
    (33, 77, 2, 2, 256, dict(is_causal=True)),
    (1000, 1000, 8, 1, 128, dict(is_causal=True)),
    (300, 257, 4, 4, 112, dict(softcap=20.0, local_window_size=(100, 0))),
    # A negative scale: the FP8 kernel takes its row maxima before scaling, so these run dequantized.
    (65, 70, 2, 1, 64, dict(scale=-0.5, is_causal=True)),
])
def test_matches_the_float64_reference(platform, rng, seq_q, seq_k, heads_q, heads_kv, head_dim, mask):
    qkv, scales = _inputs(rng, platform, seq_q=seq_q, seq_k=seq_k, heads_q=heads_q, heads_kv=heads_kv,
                          head_dim=head_dim)
    attend = functools.partial(jax_flash.dot_product_attention_fp8, **scales, **mask)
    out = jax.jit(attend)(*qkv)
    assert out.dtype == jnp.bfloat16 and out.shape == qkv[0].shape
    ref = at.numpy_attention(*_real_values(qkv, scales), **mask)
    if platform == "gpu" and fp8_kernel_applies(head_dim, mask.get("scale", 1.0), mask.get("softcap", 0.0)):
        at.assert_lowers_to_kernels(jax.jit(attend).lower(*qkv).as_text(), platform, ops=("fp8_fwd",))
        at.assert_rule(out, _e4m3_probability_baseline(qkv, scales, mask), ref)
    else:
        at.run_flash_checked(attend, qkv, platform)
        at.assert_rule(out, jax.jit(functools.partial(attend, implementation="xla"))(*qkv), ref)


def test_scales_may_be_traced(platform, rng):
    qkv, scales = _inputs(rng, platform, seq_q=40, seq_k=40, heads_q=2, heads_kv=2, head_dim=64)
    static = jax.jit(functools.partial(jax_flash.dot_product_attention_fp8, **scales, is_causal=True))(*qkv)
    traced = jax.jit(lambda q, k, v, s: jax_flash.dot_product_attention_fp8(
        q, k, v, query_scale=s[0], key_scale=s[1], value_scale=s[2], is_causal=True))(
        *qkv, jnp.asarray([scales["query_scale"], scales["key_scale"], scales["value_scale"]], jnp.float32))
    np.testing.assert_array_equal(np.asarray(traced, np.float32), np.asarray(static, np.float32))


def test_vmap_matches_a_loop_and_masked_rows_are_zero(platform, rng):
    qkv, scales = _inputs(rng, platform, seq_q=30, seq_k=30, heads_q=4, heads_kv=2, head_dim=64, batch=3)
    lengths = jnp.asarray([30, 11, 0], jnp.int32)

    def one(q, k, v, length):
        return jax_flash.dot_product_attention_fp8(q, k, v, **scales, query_seq_lengths=length[None],
                                                   key_value_seq_lengths=length[None])

    mapped = np.asarray(jax.jit(jax.vmap(one))(*qkv, lengths), np.float32)
    looped = np.stack([np.asarray(jax.jit(one)(*(x[b] for x in qkv), lengths[b]), np.float32) for b in range(3)])
    np.testing.assert_array_equal(mapped, looped)
    assert np.all(mapped[1, 11:] == 0) and np.all(mapped[2] == 0) and np.all(np.isfinite(mapped))


def test_vmap_over_scales_matches_a_loop(platform, rng):
    """Scales that differ per vmapped instance: the batching rule runs one call per instance."""
    qkv, scales = _inputs(rng, platform, seq_q=20, seq_k=33, heads_q=4, heads_kv=2, head_dim=64, batch=3)
    value_scales = jnp.asarray([1.0, 0.5, 2.0], jnp.float32) * scales["value_scale"]

    def one(q, k, v, value_scale):
        return jax_flash.dot_product_attention_fp8(q, k, v, query_scale=scales["query_scale"],
                                                   key_scale=scales["key_scale"], value_scale=value_scale,
                                                   is_causal=True)

    mapped = np.asarray(jax.jit(jax.vmap(one))(*qkv, value_scales), np.float32)
    looped = np.stack([np.asarray(jax.jit(one)(*(x[b] for x in qkv), value_scales[b]), np.float32)
                       for b in range(3)])
    np.testing.assert_array_equal(mapped, looped)


def test_has_no_gradient(platform, rng):
    qkv, scales = _inputs(rng, platform, seq_q=8, seq_k=8, heads_q=2, heads_kv=2, head_dim=32)

    def loss(query_scale):
        return jnp.sum(jax_flash.dot_product_attention_fp8(*qkv, **{**scales, "query_scale": query_scale}).astype(
            jnp.float32))

    with pytest.raises(TypeError, match="forward-only"):
        jax.grad(loss)(jnp.float32(scales["query_scale"]))


@pytest.mark.parametrize("change, error, message", [
    (dict(dtype=jnp.bfloat16), TypeError, "query has dtype bfloat16; supported dtypes are float8_e4m3fn"),
    (dict(key_scale=np.ones(2, np.float32)), ValueError, "key_scale must be a scalar"),
    (dict(value_scale=-1.0), ValueError, "value_scale must be positive"),
    (dict(query_scale=np.float32(0.0)), ValueError, "query_scale must be positive"),
    (dict(query_scale="1"), TypeError, "query_scale must be a number"),
    (dict(key_scale=np.int32(1)), TypeError, "key_scale must have a floating-point dtype"),
])
def test_argument_errors(platform, rng, change, error, message):
    (q, k, v), scales = _inputs(rng, platform, seq_q=8, seq_k=8, heads_q=2, heads_kv=2, head_dim=32)
    change = dict(change)
    if "dtype" in change:
        q = q.astype(change.pop("dtype"))
    with pytest.raises(error, match=message):
        jax_flash.dot_product_attention_fp8(q, k, v, **{**scales, **change})
