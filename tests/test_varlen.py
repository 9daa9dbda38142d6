"""varlen_attention (sequences packed along one token axis) against attention run on each sequence alone."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_testing as at
import jax_flash

def _offsets(lengths) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def _per_sequence(q, k, v, cu_q, cu_k, **kwargs):
    """The float64 answer: each sequence on its own, padding rows 0."""
    out = np.zeros(q.shape, np.float64)
    for s in range(len(cu_q) - 1):
        rows, keys = slice(cu_q[s], cu_q[s + 1]), slice(cu_k[s], cu_k[s + 1])
        if cu_q[s + 1] > cu_q[s] and cu_k[s + 1] > cu_k[s]:
            out[rows] = at.numpy_attention(q[None, rows], k[None, keys], v[None, keys], **kwargs)[0]
    return out


@pytest.mark.parametrize("is_causal, window, softcap", [(False, None, None), (True, None, None),
                                                        (True, (5, 0), None), (False, None, 8.0)])
def test_matches_each_sequence_alone(platform, rng, is_causal, window, softcap):
    q_lengths, k_lengths = rng.integers(0, 30, 5), rng.integers(1, 30, 5)
    if not is_causal and window is None:
        k_lengths = q_lengths + rng.integers(0, 5, 5)  # self-attention style, keys at least as long
    cu_q, cu_k = _offsets(q_lengths), _offsets(k_lengths)
    padding = 3  # tokens past the last offset
    q = at.normal(rng, (int(cu_q[-1]) + padding, 4, 32), jnp.float32, platform)
    k, v = (at.normal(rng, (int(cu_k[-1]) + padding, 2, 32), jnp.float32, platform) for _ in range(2))
    attend = functools.partial(jax_flash.varlen_attention, is_causal=is_causal, local_window_size=window,
                               softcap=softcap)
    args = (q, k, v, jnp.asarray(cu_q), jnp.asarray(cu_k))
    got = np.asarray(jax.jit(attend)(*args), np.float64)
    expected = _per_sequence(*(np.asarray(x, np.float64) for x in (q, k, v)), cu_q, cu_k, is_causal=is_causal,
                             local_window_size=window, softcap=softcap)
    np.testing.assert_allclose(got, expected, atol=2e-5)
    assert np.all(got[int(cu_q[-1]):] == 0)


def test_gradients_match_the_xla_reference(platform, rng):
    cu_q, cu_k = _offsets([7, 0, 19, 12]), _offsets([9, 4, 19, 12])
    q = at.normal(rng, (int(cu_q[-1]), 2, 32), jnp.float32, platform)
    k, v = (at.normal(rng, (int(cu_k[-1]) + 2, 1, 32), jnp.float32, platform) for _ in range(2))
    cotangent = at.normal(rng, q.shape, jnp.float32, platform)

    def grads(implementation):
        attend = functools.partial(jax_flash.varlen_attention, cu_seqlens_q=jnp.asarray(cu_q),
                                   cu_seqlens_k=jnp.asarray(cu_k), is_causal=True, implementation=implementation)
        _, vjp = jax.vjp(attend, q, k, v)
        return vjp(cotangent)

    with jax.default_matmul_precision("highest"):  # GPUs would otherwise run the XLA baseline in TF32
        want_grads = jax.jit(lambda: grads("xla"))()
    for got, want in zip(jax.jit(lambda: grads(None))(), want_grads):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5)


@pytest.mark.parametrize("bad, message", [
    (dict(query=np.zeros((2, 5, 2, 32), np.float32)), "query must have shape"),
    (dict(cu_seqlens_q=np.zeros((1,), np.int32)), "cu_seqlens_q must be a 1-D array"),
    (dict(cu_seqlens_k=np.zeros((3,), np.float32)), "cu_seqlens_k must hold integers"),
    (dict(cu_seqlens_k=np.zeros((4,), np.int32)), "same number of sequences"),
])
def test_argument_errors(bad, message):
    args = dict(query=np.zeros((5, 2, 32), np.float32), key=np.zeros((5, 2, 32), np.float32),
                value=np.zeros((5, 2, 32), np.float32), cu_seqlens_q=np.array([0, 2, 5], np.int32),
                cu_seqlens_k=np.array([0, 3, 5], np.int32))
    args.update(bad)
    with pytest.raises((ValueError, TypeError), match=message):
        jax_flash.varlen_attention(**args)
