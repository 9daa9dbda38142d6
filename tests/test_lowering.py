"""What jax_flash puts into the program: its custom calls (not the reference), with the right attributes and shapes."""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import pytest

import attention_testing as at
import jax_flash


def _qkv(rng, platform, dtype=jnp.float32):
    return at.random_qkv(rng, platform, seq_q=17, seq_k=33, heads_q=4, heads_kv=2, head_dim=64, dtype=dtype)


def _custom_calls(text):
    return re.findall(r"stablehlo\.custom_call @(\w+)", text)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_forward_is_one_custom_call_and_no_attention_math(platform, rng, dtype):
    q, k, v = _qkv(rng, platform, at.DTYPES[dtype])
    text = jax.jit(jax_flash.dot_product_attention).lower(q, k, v).as_text()
    assert _custom_calls(text) == at.kernel_targets(platform, ("fwd",))
    # No matmul, exp or reduction outside the kernel: the reference did not sneak in.
    for op in ("stablehlo.dot_general", "stablehlo.exponential", "stablehlo.reduce"):
        assert op not in text, op
    # K/V go in with their own heads_kv (never repeated for GQA), then the six token-mask operands, all zero-size
    # placeholders here; lse comes out as [batch, heads_q, seq_q] float32.
    element = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}[dtype]
    assert (f"(tensor<2x17x4x64x{element}>, tensor<2x33x2x64x{element}>, tensor<2x33x2x64x{element}>, "
            f"{', '.join(['tensor<0xi32>'] * 6)}) -> (tensor<2x17x4x64x{element}>, tensor<2x4x17xf32>)") in text


def test_gradient_calls_forward_and_backward_kernels(platform, rng):
    q, k, v = _qkv(rng, platform)
    loss = lambda q, k, v: jnp.sum(jax_flash.dot_product_attention(q, k, v, is_causal=True) ** 2)
    text = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, k, v).as_text()
    assert sorted(_custom_calls(text)) == sorted(at.kernel_targets(platform, ("fwd", "bwd")))
    assert "stablehlo.exponential" not in text
    jaxpr = str(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v))
    assert "jax_flash_attention_fwd" in jaxpr and "jax_flash_attention_bwd" in jaxpr


def test_vmap_folds_into_one_call(platform, rng):
    q, k, v = _qkv(rng, platform)
    qs = jnp.stack([q, q * 2, q * 3], axis=1)
    text = jax.jit(jax.vmap(jax_flash.dot_product_attention, in_axes=(1, None, None))).lower(qs, k, v).as_text()
    assert _custom_calls(text) == at.kernel_targets(platform, ("fwd",))
    assert "stablehlo.dot_general" not in text


@pytest.mark.parametrize("kwargs,attributes", [
    (dict(), dict(scale=0.125, window_left=-1, window_right=-1, softcap=0.0)),
    (dict(is_causal=True, scale=0.25), dict(scale=0.25, window_left=-1, window_right=0, softcap=0.0)),
    (dict(local_window_size=3), dict(scale=0.125, window_left=3, window_right=3, softcap=0.0)),
    (dict(local_window_size=(7, 2), is_causal=True, softcap=30.0),
     dict(scale=0.125, window_left=7, window_right=0, softcap=30.0)),
    (dict(local_window_size=(0, 5)), dict(scale=0.125, window_left=0, window_right=5, softcap=0.0)),
], ids=["default", "causal-scale", "window-int", "window-causal-softcap", "window-right-only"])
def test_kernel_attributes(platform, rng, kwargs, attributes):
    q, k, v = _qkv(rng, platform)
    text = jax.jit(functools.partial(jax_flash.dot_product_attention, **kwargs)).lower(q, k, v).as_text()
    found = dict(re.findall(r"(scale|window_left|window_right|softcap) = ([-0-9.e+]+) : ", text))
    assert set(found) == set(attributes), found
    for name, expected in attributes.items():
        assert float(found[name]) == pytest.approx(expected, rel=1e-6), (name, found[name])


def test_xla_implementation_calls_no_kernel(platform, rng):
    """The negative control: implementation='xla' must not reach the kernels, and must do its own math."""
    q, k, v = _qkv(rng, platform)
    text = jax.jit(functools.partial(jax_flash.dot_product_attention, implementation="xla")).lower(q, k, v).as_text()
    assert not _custom_calls(text)
    assert "stablehlo.dot_general" in text
