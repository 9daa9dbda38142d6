"""The benchmark's own logic on the CPU: its correctness gate and the visible-work FLOP count it reports."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_flash import benchmark


@pytest.mark.parametrize("heads_kv", [None, 2])
def test_check_compares_against_the_reference(heads_kv):
    case = benchmark.Case(2, 67, 4, 32, True, "float32", heads_kv=heads_kv, window=(20, 0), softcap=10.0)
    keys = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(keys[0], (2, 67, 4, 32), jnp.float32)
    k, v = (jax.random.normal(key, (2, 67, heads_kv or 4, 32), jnp.float32) for key in keys[1:])
    err = benchmark._check(case, q, k, v)
    assert 0 <= err <= 1e-4


def test_check_rejects_a_wrong_answer(monkeypatch):
    case = benchmark.Case(1, 33, 2, 32, False, "float32")
    q, k, v = (jax.random.normal(key, (1, 33, 2, 32), jnp.float32) for key in jax.random.split(jax.random.key(1), 3))
    monkeypatch.setattr(benchmark, "_attention", lambda impl, case: lambda q, k, v: q)
    with pytest.raises(AssertionError, match="disagrees"):
        benchmark._check(case, q, k, v)


@pytest.mark.parametrize("causal, window", [(False, None), (True, None), (True, (5, 0)), (False, (3, 7))])
def test_visible_pairs_counts_the_mask(causal, window):
    case = benchmark.Case(1, 50, 1, 32, causal, "float32", window=window)
    i, j = np.meshgrid(np.arange(50), np.arange(50), indexing="ij")
    left, right = window or (50, 50)
    visible = (j >= i - left) & (j <= i + (0 if causal else right))
    expected = visible.sum() if window else 50**2 / (2 if causal else 1)  # causal alone is counted as S^2 / 2
    assert case.visible_pairs() == pytest.approx(expected)
