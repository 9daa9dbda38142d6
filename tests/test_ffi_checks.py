"""The C++ handlers' own operand checks (csrc/ffi/*_operands.cc), reached by calling the CPU FFI targets directly.

Python validates every public call first, so these checks only ever see a call that bypasses it; they must still
turn it into an error naming the operand instead of a kernel reading out of bounds.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_flash import _ffi
from jax_flash._config import TOKEN_INPUTS, AttentionConfig

CPU = jax.devices("cpu")[0]
ATTRS = AttentionConfig(scale=0.25).ffi_attributes()
NO_TOKENS = [jnp.zeros((0,), jnp.int32)] * len(TOKEN_INPUTS)


def _forward(q, k, v, tokens=NO_TOKENS, lse_shape=None, attrs=ATTRS):
    b, s, h, _ = q.shape
    results = (jax.ShapeDtypeStruct(q.shape, q.dtype),
               jax.ShapeDtypeStruct(lse_shape or (b, h, s), jnp.float32))
    call = jax.ffi.ffi_call(_ffi.target_name("attention_fwd", "cpu"), results)
    with jax.default_device(CPU):
        return jax.block_until_ready(jax.jit(lambda *args: call(*args, **attrs))(q, k, v, *tokens))


def _normal(*shape, dtype=jnp.float32):
    return jnp.asarray(np.random.default_rng(0).standard_normal(shape), dtype)


def test_a_well_formed_direct_call_runs():
    q, k, v = _normal(1, 8, 2, 16), _normal(1, 8, 2, 16), _normal(1, 8, 2, 16)
    out, lse = _forward(q, k, v)
    assert out.shape == q.shape and np.all(np.isfinite(np.asarray(lse)))


@pytest.mark.parametrize("case, message", [
    ("lse", r"jax_flash: lse \[batch, heads, seq_q\] has shape \[1, 2, 7\], expected \[1, 2, 8\]"),
    ("value", r"jax_flash: value has shape \[1, 9, 2, 16\], expected \[1, 8, 2, 16\]"),
    ("head_dim", r"jax_flash: head_dim 264 unsupported on this platform \(at most 256, a multiple of 1\)"),
    ("dtype", r"jax_flash: dtype must be float32, float16 or bfloat16"),
    ("lengths", r"jax_flash: query_seq_lengths has shape \[2\], expected \[1\]"),
])
def test_a_malformed_call_names_the_operand(case, message):
    d = 264 if case == "head_dim" else 16
    dtype = jnp.int32 if case == "dtype" else jnp.float32
    q, k = _normal(1, 8, 2, d, dtype=dtype), _normal(1, 8, 2, d, dtype=dtype)
    v = _normal(1, 9, 2, d) if case == "value" else k
    tokens, attrs = NO_TOKENS, ATTRS
    if case == "lengths":
        tokens = [jnp.array([4, 4], jnp.int32)] + NO_TOKENS[1:]
        attrs = AttentionConfig(scale=0.25, token_inputs=("q_lengths",)).ffi_attributes()
    with pytest.raises(Exception, match=message):
        _forward(q, k, v, tokens=tokens, lse_shape=(1, 2, 7) if case == "lse" else None, attrs=attrs)


def test_a_malformed_decode_call_names_the_cache():
    q, k = _normal(1, 1, 4, 16), _normal(1, 32, 2, 16)
    v = _normal(1, 32, 1, 16)
    lengths, page_table = jnp.array([32], jnp.int32), jnp.array([[0]], jnp.int32)
    results = (jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((1, 4, 1), jnp.float32))
    call = jax.ffi.ffi_call(_ffi.target_name("decode", "cpu"), results)
    with pytest.raises(Exception, match=r"jax_flash: the value cache has shape \[1, 32, 1, 16\], expected "
                                        r"\[1, 32, 2, 16\]"):
        with jax.default_device(CPU):
            jax.block_until_ready(jax.jit(lambda *args: call(*args, **ATTRS))(q, k, v, lengths, page_table))
