"""The CUDA backward with deterministic=True gives bitwise-identical gradients run after run.

Every gradient element is then summed by one warp in a fixed order (no atomics), so repeated calls, and
recompilations, must agree to the bit. GQA makes dk/dv sums over several query heads, and lengths that are not
multiples of the tiles exercise partial blocks. deterministic=False (the default) may sum dQ with atomics; it is
compared with the deterministic backward.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

import attention_testing as at
import jax_flash


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_backward_is_bitwise_stable(gpu_platform, rng, dtype, head_dim):
    q, k, v = at.random_qkv(rng, gpu_platform, seq_q=1000, seq_k=777, heads_q=8, heads_kv=2, head_dim=head_dim,
                            dtype=at.DTYPES[dtype], batch=2)
    cotangent = at.normal(rng, q.shape, at.DTYPES[dtype], gpu_platform)

    def grads(q, k, v, cotangent):
        attend = lambda q, k, v: jax_flash.dot_product_attention(q, k, v, is_causal=True, deterministic=True)
        out, vjp = jax.vjp(attend, q, k, v)
        return (out, *vjp(cotangent))

    runs = []
    for _ in range(3):
        # A fresh jit each time: recompiling must not change the result either.
        runs.append([np.asarray(x) for x in jax.jit(grads)(q, k, v, cotangent)])
    for other in runs[1:]:
        for name, first, again in zip(("out", "dq", "dk", "dv"), runs[0], other):
            assert np.all(np.isfinite(first.astype(np.float32))), name
            assert first.tobytes() == again.tobytes(), f"{name} differs between runs"


# The Hopper backward fuses dQ into its key-major kernel for head dims 65..128 with at least 2048 queries
# (query_gradient_sum.cuh); these shapes take that path on an H200, the tensor-core kernels' atomics elsewhere.
FUSED_MASKS = {
    "causal": dict(is_causal=True),
    "window": dict(local_window_size=(300, 40)),
    "softcap": dict(softcap=20.0),
    "kv_lengths": dict(is_causal=True, key_value_seq_lengths=np.array([1500, 2111], np.int32)),
}


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("head_dim", [80, 128])
@pytest.mark.parametrize("mask", sorted(FUSED_MASKS))
def test_fused_backward_matches_the_deterministic_one(gpu_platform, rng, dtype, head_dim, mask):
    """deterministic=False against deterministic=True: dk, dv and out come from the same arithmetic, dq from the same
    products summed in another order (one rounding apart)."""
    q, k, v = at.random_qkv(rng, gpu_platform, seq_q=2100, seq_k=2111, heads_q=8, heads_kv=2, head_dim=head_dim,
                            dtype=at.DTYPES[dtype], batch=2)
    cotangent = at.normal(rng, q.shape, at.DTYPES[dtype], gpu_platform)
    options = FUSED_MASKS[mask]

    def grads(deterministic):
        attend = lambda q, k, v: jax_flash.dot_product_attention(q, k, v, deterministic=deterministic, **options)

        def run(q, k, v, cotangent):
            out, vjp = jax.vjp(attend, q, k, v)
            return (out, *vjp(cotangent))

        return [np.asarray(x, np.float32) for x in jax.jit(run)(q, k, v, cotangent)]

    fused, reference = grads(False), grads(True)
    for name, a, b in zip(("out", "dq", "dk", "dv"), fused, reference):
        assert np.all(np.isfinite(a)), name
        if name == "dq":
            np.testing.assert_allclose(a, b, rtol=0, atol=2 * at.eps(at.DTYPES[dtype]) * np.max(np.abs(b)))
        else:
            np.testing.assert_array_equal(a, b, err_msg=name)
