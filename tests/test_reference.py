"""The references themselves: the independent float64 numpy implementation (attention_testing.numpy_attention) vs
jax_flash.attention_reference in float64 (forward, lse and autodiff gradients), and both vs
jax.nn.dot_product_attention(implementation='xla') in float32 for the causal / local-window / GQA / Sq != Sk
semantics. No jax_flash kernel runs here, so a wrong reference cannot hide a wrong kernel.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_testing as at
import jax_flash

# (seq_q, seq_k, heads_q, heads_kv, is_causal, local_window_size, softcap)
SEMANTIC_CASES = [
    (17, 17, 2, 2, False, None, None),
    (17, 17, 4, 2, True, None, None),
    (5, 17, 4, 1, True, None, None),  # Sq < Sk: causal stays top-left aligned (row i sees keys <= i)
    (17, 5, 8, 1, True, None, None),  # Sq > Sk
    (17, 17, 2, 1, False, 3, None),  # symmetric int window
    (17, 11, 4, 2, False, (8, 0), None),
    (11, 17, 4, 4, False, (0, 5), None),
    (17, 17, 2, 2, True, (6, 6), None),  # causal combined with a window: right bound becomes 0
    (13, 29, 8, 4, False, (2, 9), None),
]


@pytest.fixture(autouse=True)
def _on_cpu_in_true_float32():
    """These checks are about semantics, not about a device: run on the CPU with float32 matmuls in float32 (a GPU
    default device would use TF32)."""
    with jax.default_device(jax.devices("cpu")[0]), jax.default_matmul_precision("highest"):
        yield


def _inputs(rng, seq_q, seq_k, heads_q, heads_kv, head_dim=16, batch=2):
    q = rng.standard_normal((batch, seq_q, heads_q, head_dim))
    k = rng.standard_normal((batch, seq_k, heads_kv, head_dim))
    v = rng.standard_normal((batch, seq_k, heads_kv, head_dim))
    return q, k, v


def _kwargs(is_causal, window, softcap):
    return dict(is_causal=is_causal, local_window_size=window, softcap=softcap)


def _rows_seeing_keys(seq_q, seq_k, is_causal, window):
    left, right = at.window_bounds(is_causal, window)
    return at.visible_mask(seq_q, seq_k, left, right).any(axis=1)


@pytest.mark.parametrize("seq_q,seq_k,heads_q,heads_kv,is_causal,window,softcap", SEMANTIC_CASES + [
    (17, 17, 4, 2, False, None, 3.0),
    (9, 23, 4, 1, True, (5, 0), 1.5),
    (23, 9, 2, 2, False, (0, 0), None),  # rows >= 9 see no key at all
])
def test_numpy_matches_attention_reference_float64(rng, seq_q, seq_k, heads_q, heads_kv, is_causal, window, softcap):
    q, k, v = _inputs(rng, seq_q, seq_k, heads_q, heads_kv)
    cotangent = rng.standard_normal(q.shape)
    kwargs = _kwargs(is_causal, window, softcap)
    out_np, grads_np = at.numpy_attention(q, k, v, cotangent, **kwargs)

    @jax.jit
    def reference_and_vjp(q, k, v, cotangent):
        out, vjp = jax.vjp(lambda q, k, v: at.reference_attention(q, k, v, **kwargs), q, k, v)
        return out, vjp(cotangent)

    out_ref, grads_ref = reference_and_vjp(*(jnp.asarray(x) for x in (q, k, v, cotangent)))
    assert out_ref.dtype == jnp.float64
    np.testing.assert_allclose(np.asarray(out_ref), out_np, rtol=1e-12, atol=1e-12)
    for name, g_ref, g_np in zip("qkv", grads_ref, grads_np):
        np.testing.assert_allclose(np.asarray(g_ref), g_np, rtol=1e-10, atol=1e-12, err_msg=f"d{name}")
    # Rows that see no key: output 0 (and zero gradient into q).
    blind = ~_rows_seeing_keys(seq_q, seq_k, is_causal, window)
    assert np.all(out_np[:, blind] == 0) and np.all(np.asarray(out_ref)[:, blind] == 0)
    assert np.all(np.asarray(grads_ref[0])[:, blind] == 0)


def test_reference_lse(rng):
    q, k, v = _inputs(rng, 13, 7, 4, 2)
    left, right = 2, 0
    out, lse = jax.jit(lambda q, k, v: jax_flash.attention_reference(
        q, k, v, scale=0.3, window_left=left, window_right=right, return_lse=True))(q, k, v)
    assert lse.shape == (2, 4, 13) and lse.dtype == jnp.float32
    visible = at.visible_mask(13, 7, left, right)
    qg = q.reshape(2, 13, 2, 2, 16)
    logits = np.einsum("bthgd,bshd->bhgts", qg, k) * 0.3
    logits = np.where(visible, logits, -np.inf)
    with np.errstate(divide="ignore"):
        expected = np.log(np.sum(np.exp(logits), axis=-1)).reshape(2, 4, 13)
    assert np.all(np.isneginf(np.asarray(lse)[..., ~visible.any(axis=1)]))
    np.testing.assert_allclose(np.asarray(lse), expected.astype(np.float32), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(out), at.numpy_attention(q, k, v, scale=0.3, local_window_size=(2, 0)),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("seq_q,seq_k,heads_q,heads_kv,is_causal,window,softcap", SEMANTIC_CASES)
def test_numpy_matches_jax_nn_float32(rng, seq_q, seq_k, heads_q, heads_kv, is_causal, window, softcap):
    """Our reading of is_causal / local_window_size / GQA is jax.nn's (away from rows that see nothing, where jax.nn
    averages over all keys instead of returning 0)."""
    q, k, v = _inputs(rng, seq_q, seq_k, heads_q, heads_kv)
    assert _rows_seeing_keys(seq_q, seq_k, is_causal, window).all()
    expected = at.numpy_attention(q, k, v, **_kwargs(is_causal, window, softcap))
    q32, k32, v32 = (jnp.asarray(x, jnp.float32) for x in (q, k, v))
    got_jax_nn = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(
        q, k, v, is_causal=is_causal, local_window_size=window, implementation="xla"))(q32, k32, v32)
    np.testing.assert_allclose(np.asarray(got_jax_nn), expected, rtol=2e-5, atol=2e-5)
    # The public wrapper's pure-JAX path (argument mapping included) agrees as well.
    got_public_xla = jax.jit(lambda q, k, v: jax_flash.dot_product_attention(
        q, k, v, is_causal=is_causal, local_window_size=window, implementation="xla"))(q32, k32, v32)
    np.testing.assert_allclose(np.asarray(got_public_xla), expected, rtol=2e-5, atol=2e-5)


def test_numpy_softcap_matches_definition(rng):
    """softcap: logits s become c * tanh(s / c) before the softmax (checked against a direct loop)."""
    q, k, v = _inputs(rng, 3, 5, 1, 1, head_dim=4, batch=1)
    cap, scale = 0.7, 1 / math.sqrt(4)
    expected = np.zeros_like(q)
    for i in range(3):
        s = np.array([cap * math.tanh(scale * q[0, i, 0] @ k[0, j, 0] / cap) for j in range(5)])
        p = np.exp(s - s.max())
        expected[0, i, 0] = (p / p.sum()) @ v[0, :, 0]
    np.testing.assert_allclose(at.numpy_attention(q, k, v, softcap=cap), expected, rtol=1e-12, atol=1e-12)


def test_gqa_head_mapping(rng):
    """Query head h reads kv head h // (heads_q // heads_kv), as jax.nn does: equal to repeating K/V per group."""
    q, k, v = _inputs(rng, 9, 11, 6, 2)
    k_rep, v_rep = np.repeat(k, 3, axis=2), np.repeat(v, 3, axis=2)
    np.testing.assert_allclose(at.numpy_attention(q, k, v, is_causal=True),
                               at.numpy_attention(q, k_rep, v_rep, is_causal=True), rtol=1e-12, atol=1e-12)
    got = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla"))(
        *(jnp.asarray(x, jnp.float32) for x in (q, k, v)))
    np.testing.assert_allclose(np.asarray(got), at.numpy_attention(q, k_rep, v_rep, is_causal=True), rtol=2e-5,
                               atol=2e-5)
