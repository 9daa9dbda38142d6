"""return_residual=True: the softmax's log-sum-exp beside the output, as jax.nn.dot_product_attention returns it.

The residual is checked under the suite's tolerance rule (attention_testing.py) against jax.nn's (or, where jax.nn
cannot be the baseline, jax_flash's own XLA path) and the float64 reference, on random data; rows that see no key
give -inf. Its gradient is stopped, as in jax.nn: adding it to a loss leaves every gradient unchanged.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_testing as at
import jax_flash
from jax_flash.reference import attention_reference


class Case(NamedTuple):
    seq_q: int
    seq_k: int
    heads_q: int
    heads_kv: int
    head_dim: int
    dtype: str
    is_causal: bool = False
    window: tuple | None = None
    softcap: float | None = None

    def id(self) -> str:
        mask = "causal" if self.is_causal else f"window{self.window}" if self.window else "full"
        cap = f"-cap{self.softcap}" if self.softcap else ""
        return (f"q{self.seq_q}k{self.seq_k}-h{self.heads_q}/{self.heads_kv}-d{self.head_dim}-{self.dtype}-"
                f"{mask}{cap}")


CASES = [
    Case(17, 17, 4, 2, 64, "float32", is_causal=True),
    Case(113, 77, 2, 1, 80, "bfloat16"),
    Case(1, 33, 4, 4, 32, "float16"),
    Case(64, 100, 6, 2, 96, "float32", window=(8, 3)),
    Case(40, 40, 2, 2, 128, "bfloat16", is_causal=True, softcap=20.0),
]


def reference_residual(q, k, v, *, scale, is_causal, window, softcap, q_lengths=None, kv_lengths=None):
    """float64 log-sum-exp [batch, seq_q, heads_q] from float64 copies of the inputs."""
    left, right = at.window_bounds(is_causal, window)
    q, k, v = at.to_float64((q, k, v))
    _, lse = attention_reference(q, k, v, scale=scale, window_left=left, window_right=right,
                                 softcap=0.0 if softcap is None else softcap, return_lse=True, q_lengths=q_lengths,
                                 kv_lengths=kv_lengths)
    return jnp.swapaxes(lse, 1, 2)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id()) for c in CASES])
def test_residual_within_the_rule(case, platform, rng):
    at.skip_if_unsupported(platform, case.head_dim)
    dtype = at.DTYPES[case.dtype]
    q, k, v = at.random_qkv(rng, platform, seq_q=case.seq_q, seq_k=case.seq_k, heads_q=case.heads_q,
                            heads_kv=case.heads_kv, head_dim=case.head_dim, dtype=dtype)
    kwargs = dict(is_causal=case.is_causal, local_window_size=case.window, softcap=case.softcap,
                  return_residual=True)
    out, residual = at.run_flash_checked(lambda *a: at.flash_attention(*a, **kwargs), (q, k, v), platform)
    # jax.nn's float16 path asks XLA:GPU for a dot algorithm it rejects once return_residual is set (H100, jax
    # 0.11.2: "Unsupported dot precision algorithm"); jax_flash's own XLA path is the float16 baseline there.
    if platform == "gpu" and dtype == jnp.float16:
        baseline = lambda *a: jax_flash.dot_product_attention(*a, implementation="xla", **kwargs)
    else:
        baseline = lambda *a: at.xla_attention(platform, dtype)(*a, **kwargs)
    xla_out, xla_residual = jax.jit(baseline)(q, k, v)
    scale = 1.0 / math.sqrt(case.head_dim)
    ref_residual = reference_residual(q, k, v, scale=scale, is_causal=case.is_causal, window=case.window,
                                      softcap=case.softcap)
    ref_out = at.reference_attention(q, k, v, is_causal=case.is_causal, local_window_size=case.window,
                                     softcap=case.softcap)
    assert residual.shape == (q.shape[0], case.seq_q, case.heads_q) == xla_residual.shape
    at.assert_rule(out, xla_out, ref_out, what="output")
    at.assert_rule(residual, xla_residual, ref_residual, what="residual")


def test_rows_without_keys_give_minus_infinity(platform, rng):
    q, k, v = at.random_qkv(rng, platform, seq_q=24, seq_k=20, heads_q=2, heads_kv=1, head_dim=32,
                            dtype=jnp.float32)
    q_lengths, kv_lengths = jnp.array([24, 10], jnp.int32), jnp.array([20, 0], jnp.int32)
    out, residual = jax.jit(lambda *a: jax_flash.dot_product_attention(
        *a, query_seq_lengths=q_lengths, key_value_seq_lengths=kv_lengths, return_residual=True))(q, k, v)
    expected = reference_residual(q, k, v, scale=1 / math.sqrt(32), is_causal=False, window=None, softcap=None,
                                  q_lengths=q_lengths, kv_lengths=kv_lengths)
    residual, expected = np.asarray(residual), np.asarray(expected)
    # Row batch 1 has no key at all; every other row sees all 20 keys.
    assert np.all(residual[1] == -np.inf) and np.all(expected[1] == -np.inf)
    np.testing.assert_allclose(residual[0], expected[0], rtol=1e-5, atol=1e-5)
    assert np.all(np.asarray(out)[1] == 0)


def test_residual_has_no_gradient(platform, rng):
    q, k, v = at.random_qkv(rng, platform, seq_q=33, seq_k=33, heads_q=4, heads_kv=2, head_dim=64,
                            dtype=jnp.float32)
    cotangent = at.normal(rng, q.shape, jnp.float32, platform)

    def loss(with_residual):
        def f(q, k, v):
            out, residual = jax_flash.dot_product_attention(q, k, v, is_causal=True, return_residual=True)
            return jnp.sum(out * cotangent) + (jnp.sum(residual) if with_residual else 0.0)
        return jax.jit(jax.grad(f, argnums=(0, 1, 2)))(q, k, v)

    plain, with_residual = loss(False), loss(True)
    for a, b in zip(plain, with_residual):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert any(float(jnp.max(jnp.abs(g))) > 0 for g in plain)


def test_unbatched_and_vmapped_shapes(platform, rng):
    q, k, v = at.random_qkv(rng, platform, seq_q=9, seq_k=12, heads_q=4, heads_kv=2, head_dim=32,
                            dtype=jnp.float32, batch=3)
    batched = jax_flash.dot_product_attention(q, k, v, return_residual=True)
    unbatched = jax_flash.dot_product_attention(q[1], k[1], v[1], return_residual=True)
    vmapped = jax.vmap(lambda *a: jax_flash.dot_product_attention(*a, return_residual=True))(q, k, v)
    nn = jax.nn.dot_product_attention(q[1], k[1], v[1], return_residual=True)
    assert unbatched[1].shape == nn[1].shape == (9, 4)
    assert batched[1].shape == vmapped[1].shape == (3, 9, 4)
    np.testing.assert_allclose(np.asarray(unbatched[1]), np.asarray(batched[1][1]), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(vmapped[1]), np.asarray(batched[1]), rtol=1e-6)


def test_return_residual_must_be_a_bool():
    q = jnp.ones((1, 4, 2, 32), jnp.float32)
    with pytest.raises(TypeError, match="return_residual must be a bool"):
        jax_flash.dot_product_attention(q, q, q, return_residual="yes")
