"""The CUDA backward is deterministic: the same inputs give bitwise-identical gradients run after run.

Every gradient element is summed by one warp in a fixed order (no atomics), so repeated calls, and recompilations,
must agree to the bit. GQA makes dk/dv sums over several query heads, and lengths that are not multiples of the
tiles exercise partial blocks.
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
        out, vjp = jax.vjp(lambda q, k, v: jax_flash.dot_product_attention(q, k, v, is_causal=True), q, k, v)
        return (out, *vjp(cotangent))

    runs = []
    for _ in range(3):
        # A fresh jit each time: recompiling must not change the result either.
        runs.append([np.asarray(x) for x in jax.jit(grads)(q, k, v, cotangent)])
    for other in runs[1:]:
        for name, first, again in zip(("out", "dq", "dk", "dv"), runs[0], other):
            assert np.all(np.isfinite(first.astype(np.float32))), name
            assert first.tobytes() == again.tobytes(), f"{name} differs between runs"
