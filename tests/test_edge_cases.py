"""Numerical edge cases: rows that see no key, and large-magnitude inputs."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_testing as at
import jax_flash

DTYPE_NAMES = ["float32", "bfloat16", "float16"]


# The XLA baseline for rows that see nothing: jax_flash's pure-JAX path (float32 compute, rounded to the input dtype)
# shares the "such a row gives 0" convention, whereas jax.nn averages those rows over all keys.
_PUBLIC_XLA = functools.partial(jax_flash.dot_product_attention, implementation="xla")


@pytest.mark.parametrize("dtype", DTYPE_NAMES)
@pytest.mark.parametrize("seq_q,seq_k,kwargs", [
    (200, 17, dict(local_window_size=(0, 0))),  # rows 17.. see nothing (several query tiles of them)
    (113, 1, dict(local_window_size=(0, 0))),  # only row 0 sees its key
    (40, 30, dict(is_causal=True, local_window_size=(3, 5))),  # rows 33.. see nothing
    (50, 20, dict(local_window_size=(2, 0), softcap=4.0)),  # rows 22.. see nothing, with a soft-cap
], ids=["window0-q200k17", "window0-q113k1", "causal-window-q40k30", "window-softcap-q50k20"])
def test_rows_that_see_no_key(platform, rng, dtype, seq_q, seq_k, kwargs):
    q, k, v = at.random_qkv(rng, platform, seq_q=seq_q, seq_k=seq_k, heads_q=4, heads_kv=2, head_dim=32,
                            dtype=at.DTYPES[dtype])
    cotangent = at.normal(rng, q.shape, q.dtype, platform)
    left, right = at.window_bounds(kwargs.get("is_causal", False), kwargs.get("local_window_size"))
    blind = ~at.visible_mask(seq_q, seq_k, left, right).any(axis=1)
    assert blind.any()

    transform = at.fwd_and_vjp(**kwargs)
    out, (dq, dk, dv) = at.run_flash_checked(transform(at.flash_attention), (q, k, v, cotangent), platform,
                                             ("fwd", "bwd"))
    for name, x in (("out", out), ("dq", dq), ("dk", dk), ("dv", dv)):
        assert np.all(np.isfinite(np.asarray(x, np.float32))), f"{name} has non-finite values"
    assert np.all(np.asarray(out, np.float32)[:, blind] == 0), "rows that see no key must be exactly 0"
    assert np.all(np.asarray(dq, np.float32)[:, blind] == 0), "their query gradient must be exactly 0"

    xla = jax.jit(transform(_PUBLIC_XLA))(q, k, v, cotangent)
    ref = at.numpy_attention(*(np.asarray(x).astype(np.float64) for x in (q, k, v, cotangent)), **kwargs)
    at.assert_trees_rule((out, (dq, dk, dv)), xla, ref)


@pytest.mark.parametrize("dtype", DTYPE_NAMES)
@pytest.mark.parametrize("what", ["qkv", "qk_only", "softcap"])
def test_large_magnitude_inputs(platform, rng, dtype, what):
    """|x| ~ 1e3: logits ~ 1e6 in every dtype; the softmax saturates but nothing may overflow to inf/NaN.

    Logits this large carry rounding errors of O(0.1) in float32 itself, so the problem is ill-conditioned and the
    errors of two float32 computations are of one order but uncorrelated: the 2x-of-XLA norm rule is no meaningful
    statistic here. Checked instead: everything finite, and the max-abs guard (4x XLA's max error + 16 eps * scale),
    where for dq and dk the scale is that of the terms whose difference they are: scale * max|k| (resp. |q|) *
    max|dO v^T| (the softmax is saturated, so exact dq, dk are ~0 while the kernel's are the rounding residue of
    dP - rowsum(dO * O), FlashAttention's formulation of the softmax gradient).
    """
    dt = at.DTYPES[dtype]
    q, k, v = at.random_qkv(rng, platform, seq_q=113, seq_k=77, heads_q=4, heads_kv=2, head_dim=64, dtype=dt,
                            magnitude=1e3)
    if what == "qk_only":
        v = at.normal(rng, v.shape, dt, platform)
    kwargs = dict(is_causal=True, softcap=50.0 if what == "softcap" else None)
    cotangent = at.normal(rng, q.shape, dt, platform)
    got, xla, ref = at.fwd_and_vjp_all(q, k, v, cotangent, platform, **kwargs)

    q64, k64, v64, ct64 = (np.asarray(x).astype(np.float64) for x in (q, k, v, cotangent))
    group = q.shape[2] // k.shape[2]
    dp_max = at.max_abs(np.einsum("bthd,bshd->bhts", ct64, np.repeat(v64, group, axis=2)))
    scale = q.shape[-1] ** -0.5
    # dv = P^T dO, where a flash backward recomputes P from the logits and a float32 lse: a row's lse of ~4e6 is
    # only resolved to u |lse| ~ 0.25 (u = 2^-24), so that row's recomputed P is off by a fraction of that order,
    # which XLA, keeping the forward's P, does not have; cuDNN's dv error on this case is 1.1-1.2 on the H200. Bound:
    # 4 u * the root-sum-square over the queries a dv element collects of P_ij |lse_i| dO_i (independent roundings
    # per row), written as a max_scale for the guard.
    _, logits, probs = at.numpy_probabilities(q64, k64, scale=scale, **kwargs)
    row_lse = np.abs(np.max(np.where(np.isfinite(logits), logits, 0.0), axis=-1, keepdims=True))
    dout_squared = (ct64 ** 2).reshape(*ct64.shape[:2], k.shape[2], group, -1)
    lse_spread = at.max_abs(np.sqrt(np.einsum("bhgts,bthgd->bshd", (probs * row_lse) ** 2, dout_squared)))
    dv_scale = at.max_abs(ref[1][2]) + 4 * 2.0 ** -24 * lse_spread / (16 * at.eps(dt))
    scales = (None, scale * at.max_abs(k64) * dp_max, scale * at.max_abs(q64) * dp_max, dv_scale)
    leaves = zip(jax.tree.leaves(got), jax.tree.leaves(xla), jax.tree.leaves(ref), scales, ("out", "dq", "dk", "dv"))
    for actual, baseline, reference, max_scale, name in leaves:
        at.assert_max_abs_guard(actual, baseline, reference, max_scale=max_scale, what=name)
    out = got[0]
    assert float(jnp.max(jnp.abs(out.astype(jnp.float32)))) > (100 if what != "qk_only" else 0.5)  # not all zero


def test_cpu_results_are_deterministic(platform, rng):
    """The CPU backward sums its per-chunk dQ buffers in a fixed order: repeated runs agree bit for bit."""
    if platform != "cpu":
        pytest.skip("determinism is a documented property of the CPU kernels only")
    q, k, v = at.random_qkv(rng, platform, seq_q=113, seq_k=300, heads_q=8, heads_kv=2, head_dim=64,
                            dtype=jnp.float32)
    cotangent = at.normal(rng, q.shape, q.dtype, platform)
    f = jax.jit(at.fwd_and_vjp(is_causal=True)(at.flash_attention))
    first = f(q, k, v, cotangent)
    for _ in range(3):
        again = f(q, k, v, cotangent)
        for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(again)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("dtype", DTYPE_NAMES)
def test_cpu_single_key_rows_have_exactly_zero_query_gradients(platform, rng, dtype):
    """A row that sees one key has P = 1, so its output is that value row and dP - delta cancels: dQ is exactly 0, as
    in XLA's autodiff. The CPU backward sums delta with dP's own GEMM code and rounding, so the cancellation is exact
    there (the GPU kernels' tensor-core dP differs from their delta by rounding)."""
    if platform != "cpu":
        pytest.skip("exact cancellation is a property of the CPU kernels only")
    # Causal over 17 keys: row 0 sees key 0 only; the tile spans the GEMM's vector and scalar column paths.
    q, k, v = at.random_qkv(rng, platform, seq_q=17, seq_k=17, heads_q=4, heads_kv=2, head_dim=96,
                            dtype=at.DTYPES[dtype], batch=2)
    cotangent = at.normal(rng, q.shape, q.dtype, platform)
    _, (dq, _, _) = jax.jit(at.fwd_and_vjp(is_causal=True)(at.flash_attention))(q, k, v, cotangent)
    assert np.all(np.asarray(dq[:, 0], np.float32) == 0)
    assert np.all(np.abs(np.asarray(dq[:, 1:], np.float32)).max(axis=-1) > 0)  # the other rows do get gradients
