"""Argument errors: each asserts the exception type and that the message names the offending argument.

Validation happens at trace time, before any kernel runs, for both implementations (jax_flash's kernels and 'xla').
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_testing as at
import jax_flash


def _arrays(rng, platform, q_shape, k_shape, v_shape=None, dtypes=("float32",) * 3):
    v_shape = k_shape if v_shape is None else v_shape
    return tuple(at.normal(rng, shape, at.DTYPES.get(dtype, dtype), platform)
                 for shape, dtype in zip((q_shape, k_shape, v_shape), dtypes))


Q, KV = (2, 5, 4, 16), (2, 7, 2, 16)

# name: (q_shape, k_shape, v_shape, dtypes, kwargs, exception, message regex)
ERROR_CASES = {
    "query_rank_2": ((5, 16), KV, None, None, {}, ValueError, r"query must have rank 4"),
    "key_rank_5": (Q, (1, 2, 7, 2, 16), None, None, {}, ValueError, r"key must have rank 4"),
    "value_rank_2": (Q, KV, (7, 16), None, {}, ValueError, r"value must have rank 4"),
    "mixed_ranks": ((5, 4, 16), KV, None, None, {}, ValueError, r"query, key and value must have the same rank"),
    "batch_mismatch": ((3, 5, 4, 16), KV, None, None, {}, ValueError, r"query and key must have the same batch size"),
    "head_dim_mismatch": ((2, 5, 4, 32), KV, None, None, {}, ValueError, r"query and key must have the same head_dim"),
    "heads_not_multiple": ((2, 5, 6, 16), (2, 7, 4, 16), None, None, {}, ValueError,
                           r"number of query heads \(6\) must be a multiple of the number of key/value heads \(4\)"),
    "more_kv_heads_than_q": ((2, 5, 2, 16), (2, 7, 4, 16), None, None, {}, ValueError,
                             r"number of query heads \(2\) must be a multiple"),
    "key_value_shape_mismatch": (Q, KV, (2, 8, 2, 16), None, {}, ValueError,
                                 r"key and value must have the same shape"),
    "key_value_head_dim_mismatch": (Q, KV, (2, 7, 2, 8), None, {}, ValueError,
                                    r"key and value must have the same shape"),
    "head_dim_over_256": ((1, 3, 2, 264), (1, 3, 2, 264), None, None, {}, ValueError,
                          r"head_dim must be at most 256, got 264"),
    "query_int32": (Q, KV, None, (jnp.int32, "float32", "float32"), {}, TypeError,
                    r"query has dtype int32; supported dtypes are float32, float16 and bfloat16"),
    "key_float64": (Q, KV, None, ("float32", jnp.float64, "float32"), {}, TypeError, r"key has dtype float64"),
    "all_float64": (Q, KV, None, (jnp.float64,) * 3, {}, TypeError, r"query has dtype float64"),
    "mixed_dtypes": (Q, KV, None, ("bfloat16", "float32", "float32"), {}, TypeError,
                     r"query, key and value must have the same dtype, got bfloat16, float32 and float32"),
    "value_dtype_differs": (Q, KV, None, ("float16", "float16", "bfloat16"), {}, TypeError,
                            r"query, key and value must have the same dtype"),
    "zero_seq_q": ((2, 0, 4, 16), KV, None, None, {}, ValueError, r"query has a zero-length axis"),
    "zero_seq_k": (Q, (2, 0, 2, 16), None, None, {}, ValueError, r"key has a zero-length axis"),
    "zero_batch": ((0, 5, 4, 16), (0, 7, 2, 16), None, None, {}, ValueError, r"query has a zero-length axis"),
    "zero_head_dim": ((2, 5, 4, 0), (2, 7, 2, 0), None, None, {}, ValueError, r"query has a zero-length axis"),
    "zero_heads_value": (Q, KV, (2, 7, 0, 16), None, {}, ValueError, r"value has a zero-length axis"),
    "bias": (Q, KV, None, None, dict(bias=np.zeros((2, 4, 5, 7), np.float32)), NotImplementedError,
             r"does not accept bias"),
    "mask": (Q, KV, None, None, dict(mask=np.ones((2, 4, 5, 7), bool)), NotImplementedError,
             r"does not accept mask: use is_causal, local_window_size"),
    "window_negative": (Q, KV, None, None, dict(local_window_size=-1), ValueError,
                        r"local_window_size must be non-negative, got -1"),
    "window_negative_right": (Q, KV, None, None, dict(local_window_size=(2, -3)), ValueError,
                              r"local_window_size must be non-negative"),
    "window_float": (Q, KV, None, None, dict(local_window_size=1.5), TypeError,
                     r"local_window_size must be an int or a \(left, right\) tuple of ints, got 1.5"),
    "window_triple": (Q, KV, None, None, dict(local_window_size=(1, 2, 3)), TypeError, r"local_window_size must be"),
    "window_list": (Q, KV, None, None, dict(local_window_size=[1, 2]), TypeError, r"local_window_size must be"),
    "window_string": (Q, KV, None, None, dict(local_window_size="3"), TypeError, r"local_window_size must be"),
    "window_bool": (Q, KV, None, None, dict(local_window_size=(True, 2)), TypeError, r"local_window_size must be"),
    "softcap_negative": (Q, KV, None, None, dict(softcap=-1.0), ValueError, r"softcap must be positive"),
    "softcap_string": (Q, KV, None, None, dict(softcap="big"), TypeError, r"softcap must be a number"),
    "scale_string": (Q, KV, None, None, dict(scale="half"), TypeError, r"scale must be a number"),
    "deterministic_int": (Q, KV, None, None, dict(deterministic=1), TypeError, r"deterministic must be a bool"),
}


@pytest.mark.parametrize("implementation", [None, "xla"])
@pytest.mark.parametrize("name", list(ERROR_CASES))
def test_argument_errors(platform, rng, name, implementation):
    q_shape, k_shape, v_shape, dtypes, kwargs, exception, message = ERROR_CASES[name]
    q, k, v = _arrays(rng, platform, q_shape, k_shape, v_shape, dtypes or ("float32",) * 3)
    with pytest.raises(exception, match=message):
        jax_flash.dot_product_attention(q, k, v, implementation=implementation, **kwargs)
    # The same error at trace time under jit (for array-valued configuration, jit would trace it: call eagerly only).
    if not any(isinstance(x, np.ndarray) for x in kwargs.values()):
        fn = jax.jit(functools.partial(jax_flash.dot_product_attention, implementation=implementation, **kwargs))
        with pytest.raises(exception, match=message):
            fn(q, k, v)


def test_query_not_an_array(platform, rng):
    _, k, v = _arrays(rng, platform, Q, KV)
    with pytest.raises(TypeError, match=r"query must be an array, got list"):
        jax_flash.dot_product_attention([[1.0]], k, v)


@pytest.mark.parametrize("implementation", ["cudnn", "XLA", "pallas", ""])
def test_bad_implementation(platform, rng, implementation):
    q, k, v = _arrays(rng, platform, Q, KV)
    with pytest.raises(ValueError, match=r"implementation must be one of \(None, 'xla'\), got " + repr(implementation)):
        jax_flash.dot_product_attention(q, k, v, implementation=implementation)


@pytest.mark.parametrize("argument", ["scale", "softcap"])
def test_traced_scale_and_softcap(platform, rng, argument):
    """scale and softcap pick the compiled kernel: a traced value (a jit argument) is refused, naming the argument."""
    q, k, v = _arrays(rng, platform, Q, KV)

    @jax.jit
    def f(q, k, v, value):
        return jax_flash.dot_product_attention(q, k, v, **{argument: value})

    with pytest.raises(TypeError, match=rf"{argument} must be a concrete Python number, not a traced value"):
        f(q, k, v, 0.5)
    # Under grad with respect to the scale as well.
    with pytest.raises(TypeError, match=rf"{argument} must be a concrete Python number"):
        jax.grad(lambda s: jnp.sum(jax_flash.dot_product_attention(q, k, v, **{argument: s})))(0.5)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [1, 12, 36, 100])
def test_gpu_head_dim_not_multiple_of_8(gpu_platform, rng, head_dim):
    """The CUDA kernels need head_dim % 8 == 0: a ValueError naming head_dim at lowering (trace) time."""
    q, k, v = _arrays(rng, gpu_platform, (1, 5, 2, head_dim), (1, 7, 2, head_dim))
    fn = jax.jit(jax_flash.dot_product_attention)
    with pytest.raises(ValueError, match=rf"head_dim={head_dim} is not supported on cuda: it must be a multiple of 8"):
        fn.lower(q, k, v)
    with pytest.raises(ValueError, match=r"head_dim"):
        jax_flash.dot_product_attention(q, k, v)  # eager
    with pytest.raises(ValueError, match=r"head_dim"):
        jax.jit(jax.grad(lambda q: jnp.sum(jax_flash.dot_product_attention(q, k, v)))).lower(q)
    # The pure-JAX path still serves these sizes.
    out = jax_flash.dot_product_attention(q, k, v, implementation="xla")
    assert out.shape == q.shape and bool(jnp.all(jnp.isfinite(out)))


def test_gpu_without_cuda_kernels(rng):
    """On a GPU machine whose build lacks the CUDA kernels, lowering for the GPU says so and points to 'xla'."""
    try:
        has_gpu = bool(jax.devices("gpu"))
    except RuntimeError:
        has_gpu = False
    if not has_gpu:
        pytest.skip("no GPU on this machine")
    if "cuda" in jax_flash._ffi.compiled_platforms():
        pytest.skip("this build has CUDA kernels (covered by the accuracy tests)")
    q, k, v = _arrays(rng, "gpu", Q, KV)
    with pytest.raises(NotImplementedError, match=r"built without cuda kernels.*implementation='xla'"):
        jax.jit(jax_flash.dot_product_attention).lower(q, k, v)


def test_numpy_integer_window_is_accepted(platform, rng):
    """Window sizes read from configs are often NumPy integers; they must mean the same as Python ints."""
    q, k, v = _arrays(rng, platform, (1, 9, 2, 16), (1, 9, 2, 16))
    with_numpy = jax_flash.dot_product_attention(q, k, v, local_window_size=(np.int64(2), np.int32(1)))
    with_python = jax_flash.dot_product_attention(q, k, v, local_window_size=(2, 1))
    np.testing.assert_array_equal(np.asarray(with_numpy), np.asarray(with_python))
    unwindowed = jax_flash.dot_product_attention(q, k, v)
    assert not np.allclose(np.asarray(with_numpy), np.asarray(unwindowed))


def test_kernel_choice_environment_variable_is_checked():
    """JAX_FLASH_KERNELS picks the CUDA kernels; a value outside ('auto', 'sm80', 'sm86') fails at import, by name."""
    env = dict(os.environ, JAX_FLASH_KERNELS="sm_80")
    result = subprocess.run([sys.executable, "-c", "import jax_flash"], env=env, capture_output=True, text=True,
                            cwd=tempfile.gettempdir())
    assert result.returncode != 0
    assert "JAX_FLASH_KERNELS='sm_80'" in result.stderr and "'auto', 'sm80', 'sm86'" in result.stderr
    for choice in ("sm80", "sm86"):
        env["JAX_FLASH_KERNELS"] = choice
        subprocess.run([sys.executable, "-c", "import jax_flash"], env=env, check=True, cwd=tempfile.gettempdir())


def test_gpus_older_than_ampere_are_refused_by_name(monkeypatch):
    """The CUDA kernels exist for compute capability 8.0 on; an older GPU is named at lowering time instead of failing
    at run time with CUDA's "no kernel image". Checked with stand-in devices, so it runs on any machine."""
    from jax_flash import _primitives

    class Gpu:
        device_kind = "Tesla T4"

        def __init__(self, compute_capability):
            self.compute_capability = compute_capability

        def __str__(self):
            return "cuda:0"

    monkeypatch.setattr(_primitives._ffi, "compiled_platforms", lambda: ("cpu", "cuda"))
    monkeypatch.setattr(_primitives, "_local_gpus", lambda: [Gpu("7.5")])
    with pytest.raises(NotImplementedError, match=r"compute capability 8\.0 or newer.*Tesla T4 \(cuda:0\) has 7\.5"):
        _primitives._check_platform("cuda", 64)
    for newer in ("8.0", "8.6", "9.0", "12.0"):
        monkeypatch.setattr(_primitives, "_local_gpus", lambda capability=newer: [Gpu(capability)])
        _primitives._check_platform("cuda", 64)
    monkeypatch.setattr(_primitives, "_local_gpus", lambda: [])  # lowering for CUDA without a GPU (export)
    _primitives._check_platform("cuda", 64)
