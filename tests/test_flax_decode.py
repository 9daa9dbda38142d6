"""The Flax layers' decode mode: a prompt chunk then one token at a time through the KV cache gives, at every
position, what the layer gives on the whole sequence at once."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("flax")
from flax import nnx  # noqa: E402

import jax_flash.flax as jff  # noqa: E402

BATCH, MAX_LEN, FEATURES = 2, 16, 32
PROMPT = 5  # tokens written by the first decode call; then one per call up to SEQ
SEQ = 11
# Relative to the largest output: the cached path and the whole-sequence path round differently (other kernels,
# other summation order): a few float32 roundings, or, in bfloat16, a few roundings of the kernels' inputs and outputs.
TOLERANCE = {jnp.float32: 1e-5, jnp.bfloat16: 4 * float(jnp.finfo(jnp.bfloat16).eps)}

CASES = {
    "gqa_rotary": dict(num_heads=4, num_kv_heads=2, use_rotary=True),
    "mqa_window_softcap": dict(num_heads=4, num_kv_heads=1, local_window_size=3, softcap=2.0, use_bias=True),
    "bfloat16": dict(num_heads=4, num_kv_heads=2, use_rotary=True, dtype=jnp.bfloat16),
}


@pytest.fixture(autouse=True)
def _float32_matmuls():
    """The projections in true float32 (XLA's GPU default would be TF32, far looser than the tolerance)."""
    with jax.default_matmul_precision("highest"):
        yield


def _linen_steps(config, x):
    """(whole-sequence output, [output of each decode call]) of a linen layer."""
    layer = jff.linen.Attention(is_causal=True, decode=True, **config)
    variables = layer.init(jax.random.key(0), jnp.zeros((BATCH, MAX_LEN, FEATURES), jnp.float32))  # sizes the cache
    params, cache = variables["params"], variables["cache"]
    whole = layer.clone(decode=False).apply({"params": params}, x[:, :SEQ])

    @jax.jit
    def step(cache, chunk):
        out, updated = layer.apply({"params": params, "cache": cache}, chunk, mutable=["cache"])
        return out, updated["cache"]

    outputs = []
    for start, stop in _chunks():
        out, cache = step(cache, x[:, start:stop])
        outputs.append(out)
    np.testing.assert_array_equal(cache["cache_lengths"], [SEQ] * BATCH)
    return whole, outputs


def _nnx_steps(config, x):
    config = dict(config)
    layer = jff.nnx.Attention(FEATURES, config.pop("num_heads"), is_causal=True, **config, rngs=nnx.Rngs(0))
    whole = layer(x[:, :SEQ])
    layer.init_cache((BATCH, MAX_LEN, FEATURES), config.get("dtype", jnp.float32))

    @nnx.jit
    def step(layer, chunk):
        return layer(chunk, decode=True)

    outputs = [step(layer, x[:, start:stop]) for start, stop in _chunks()]
    np.testing.assert_array_equal(layer.cache_lengths[...], [SEQ] * BATCH)
    return whole, outputs


def _chunks():
    return [(0, PROMPT)] + [(t, t + 1) for t in range(PROMPT, SEQ)]


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("steps", [_linen_steps, _nnx_steps], ids=["linen", "nnx"])
def test_decoding_step_by_step_matches_the_whole_sequence(steps, case):
    x = jnp.asarray(np.random.default_rng(len(case)).standard_normal((BATCH, MAX_LEN, FEATURES)), jnp.float32)
    whole, outputs = steps(CASES[case], x)
    decoded = jnp.concatenate(outputs, axis=1)
    assert decoded.shape == whole.shape == (BATCH, SEQ, FEATURES)
    assert decoded.dtype == whole.dtype
    error = float(jnp.max(jnp.abs(decoded.astype(jnp.float32) - whole)) / jnp.max(jnp.abs(whole.astype(jnp.float32))))
    tolerance = TOLERANCE[CASES[case].get("dtype", jnp.float32)]
    assert error <= tolerance, f"decoded output differs from the whole sequence's by {error:.2e} (relative)"


def test_decode_refuses_what_a_cache_cannot_do():
    x = jnp.ones((BATCH, 4, FEATURES), jnp.float32)
    bidirectional = jff.nnx.Attention(FEATURES, 4, rngs=nnx.Rngs(0))
    bidirectional.init_cache((BATCH, MAX_LEN, FEATURES))
    with pytest.raises(ValueError, match="decode=True needs a causal layer"):
        bidirectional(x, decode=True)
    causal = jff.nnx.Attention(FEATURES, 4, is_causal=True, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="call init_cache"):
        causal(x, decode=True)
    causal.init_cache((BATCH, MAX_LEN, FEATURES))
    with pytest.raises(ValueError, match="segment_ids cannot be used with decode=True"):
        causal(x, segment_ids=jnp.zeros((BATCH, 4), jnp.int32), decode=True)
    with pytest.raises(ValueError, match="positions"):  # a cache that would overflow is caught while values are known
        causal(jnp.ones((BATCH, MAX_LEN + 1, FEATURES), jnp.float32), decode=True)
