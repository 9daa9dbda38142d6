"""jax_flash under each JAX transformation, compared with the float64 reference under the same transformation.

Every check goes through attention_testing.check_transform: the transformed jax_flash function must lower to
jax_flash's custom calls (so it cannot pass by silently running the reference), and its results must satisfy the
tolerance rule against the identically transformed float64 reference, with the XLA path as the baseline.
"""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_testing as at
import jax_flash

SEQ_Q, SEQ_K, HEADS_Q, HEADS_KV, HEAD_DIM, BATCH = 17, 33, 4, 2, 64, 2


def _qkv(rng, platform, dtype=jnp.float32, **overrides):
    shape = dict(seq_q=SEQ_Q, seq_k=SEQ_K, heads_q=HEADS_Q, heads_kv=HEADS_KV, head_dim=HEAD_DIM, dtype=dtype,
                 batch=BATCH)
    shape.update(overrides)
    return at.random_qkv(rng, platform, **shape)


def _loss(attention, **kwargs):
    """sum(attention(q, k, v) * cotangent), accumulated in float32."""

    def loss(q, k, v, cotangent):
        out = attention(q, k, v, **kwargs)
        return jnp.sum(out.astype(jnp.float32) * cotangent.astype(jnp.float32))

    return loss


def _add_axis(rng, x, axis, size, platform):
    """x with a new axis of `size` fresh random slices at `axis` (for vmap)."""
    shape = list(x.shape)
    shape.insert(axis, size)
    return at.normal(rng, tuple(shape), x.dtype, platform)


# ---------------------------------------------------------------------------------------------------------------------
# jit and eager


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("kwargs", [dict(), dict(is_causal=True), dict(local_window_size=(5, 2), softcap=4.0)],
                         ids=["full", "causal", "window-softcap"])
def test_jit(platform, rng, dtype, kwargs):
    q, k, v = _qkv(rng, platform, at.DTYPES[dtype])
    got, _, _ = at.check_transform(lambda attention: functools.partial(attention, **kwargs), (q, k, v), platform)
    assert got.shape == q.shape and got.dtype == q.dtype


def test_jit_static_arguments(platform, rng):
    """jax_flash.dot_product_attention jitted directly, its configuration passed as static arguments."""
    q, k, v = _qkv(rng, platform)
    static = ("scale", "is_causal", "local_window_size", "softcap")
    flash = jax.jit(jax_flash.dot_product_attention, static_argnames=static)
    kwargs = dict(scale=0.25, is_causal=True, local_window_size=(4, 1), softcap=3.0)
    at.assert_lowers_to_kernels(flash.lower(q, k, v, **kwargs).as_text(), platform)
    got = flash(q, k, v, **kwargs)
    xla = jax.jit(functools.partial(at.xla_attention(platform, q.dtype), **kwargs))(q, k, v)
    ref = jax.jit(functools.partial(at.reference_attention, **kwargs))(*at.to_float64((q, k, v)))
    at.assert_rule(got, xla, ref)
    # A second configuration must not reuse the first one's compiled kernel attributes.
    got2 = flash(q, k, v, scale=0.5, is_causal=False, local_window_size=None, softcap=None)
    xla2 = jax.jit(functools.partial(at.xla_attention(platform, q.dtype), scale=0.5))(q, k, v)
    ref2 = jax.jit(functools.partial(at.reference_attention, scale=0.5))(*at.to_float64((q, k, v)))
    at.assert_rule(got2, xla2, ref2)


def test_scale_as_numpy_and_concrete_jax_scalars(platform, rng):
    q, k, v = _qkv(rng, platform)
    ref = jax.jit(functools.partial(at.reference_attention, scale=0.3))(*at.to_float64((q, k, v)))
    xla = jax.jit(functools.partial(at.xla_attention(platform, q.dtype), scale=0.3))(q, k, v)
    for scale in (np.float32(0.3), np.float64(0.3), jnp.float32(0.3)):
        at.assert_rule(jax_flash.dot_product_attention(q, k, v, scale=scale), xla, ref, what=repr(scale))


def test_several_configurations_in_one_program(platform, rng):
    q, k, v = _qkv(rng, platform)

    def transform(attention):
        def f(q, k, v):
            return (attention(q, k, v, is_causal=True), attention(q, k, v, local_window_size=(3, 3), softcap=5.0),
                    attention(q, k, v, scale=0.05))

        return f

    at.check_transform(transform, (q, k, v), platform)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_eager(platform, rng, dtype):
    """Un-jitted calls run the kernels (bit-identical to the jitted call, checked to lower to them)."""
    q, k, v = _qkv(rng, platform, at.DTYPES[dtype])
    cotangent = at.normal(rng, q.shape, q.dtype, platform)
    kwargs = dict(is_causal=True, local_window_size=(9, 0))

    out = jax_flash.dot_product_attention(q, k, v, **kwargs)
    jitted = at.run_flash_checked(functools.partial(jax_flash.dot_product_attention, **kwargs), (q, k, v), platform)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(jitted))
    assert out.devices() == {at.device(platform)}

    grads = jax.grad(_loss(jax_flash.dot_product_attention, **kwargs), argnums=(0, 1, 2))(q, k, v, cotangent)
    # The baselines are jitted: op-by-op dispatch of them would only cost time.
    xla = jax.jit(at.fwd_and_vjp(**kwargs)(at.xla_attention(platform, q.dtype)))(q, k, v, cotangent)
    ref = jax.jit(at.fwd_and_vjp(**kwargs)(at.reference_attention))(*at.to_float64((q, k, v, cotangent)))
    at.assert_trees_rule((out, grads), xla, ref)


# ---------------------------------------------------------------------------------------------------------------------
# vmap

VMAPS = {
    # name: (in_axes, out_axes)
    "q_only": ((1, None, None), 0),
    "kv_only": ((None, 2, 2), 0),
    "all_axis0": ((0, 0, 0), 0),
    "all_mixed_axes": ((2, 1, 3), 1),
    "all_last_axis": ((4, 4, 4), 4),
}


@pytest.mark.parametrize("name", list(VMAPS))
def test_vmap(platform, rng, name):
    in_axes, out_axes = VMAPS[name]
    q, k, v = _qkv(rng, platform)
    args = tuple(x if axis is None else _add_axis(rng, x, axis, 3, platform) for x, axis in zip((q, k, v), in_axes))

    def transform(attention):
        return jax.vmap(functools.partial(attention, is_causal=True), in_axes=in_axes, out_axes=out_axes)

    got, _, _ = at.check_transform(transform, args, platform)
    expected_shape = list(q.shape)
    expected_shape.insert(out_axes, 3)
    assert got.shape == tuple(expected_shape)


def test_vmap_nested(platform, rng):
    """Outer vmap over k/v, inner over q: every (q, kv) pair of slices."""
    q, k, v = _qkv(rng, platform)
    q = _add_axis(rng, q, 0, 2, platform)
    k, v = (_add_axis(rng, x, 1, 3, platform) for x in (k, v))

    def transform(attention):
        inner = jax.vmap(functools.partial(attention, local_window_size=(6, 6)), in_axes=(0, None, None))
        return jax.vmap(inner, in_axes=(None, 1, 1), out_axes=1)

    got, _, _ = at.check_transform(transform, (q, k, v), platform)
    assert got.shape == (2, 3, *q.shape[1:])


def test_vmap_of_3d_inputs(platform, rng):
    """vmap supplies the batch axis of unbatched [seq, heads, head_dim] inputs."""
    q, k, v = _qkv(rng, platform, batch=None)
    args = (_add_axis(rng, q, 1, 3, platform), _add_axis(rng, k, 0, 3, platform), _add_axis(rng, v, 2, 3, platform))

    def transform(attention):
        return jax.vmap(functools.partial(attention, is_causal=True), in_axes=(1, 0, 2))

    got, _, _ = at.check_transform(transform, args, platform)
    assert got.shape == (3, *q.shape)


# ---------------------------------------------------------------------------------------------------------------------
# grad and its compositions


@pytest.mark.parametrize("argnums", [(0, 1, 2), 0, (1,), (2,)], ids=["qkv", "q", "k", "v"])
def test_grad(platform, rng, argnums):
    q, k, v = _qkv(rng, platform)
    cotangent = at.normal(rng, q.shape, q.dtype, platform)

    def transform(attention):
        return jax.grad(_loss(attention, is_causal=True, softcap=8.0), argnums=argnums)

    at.check_transform(transform, (q, k, v, cotangent), platform, ops=("fwd", "bwd"))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_value_and_grad(platform, rng, dtype):
    q, k, v = _qkv(rng, platform, at.DTYPES[dtype])
    cotangent = at.normal(rng, q.shape, q.dtype, platform)

    def transform(attention):
        return jax.value_and_grad(_loss(attention, local_window_size=7), argnums=(0, 1, 2))

    (_, grads), _, _ = at.check_transform(transform, (q, k, v, cotangent), platform, ops=("fwd", "bwd"))
    assert [g.dtype for g in grads] == [q.dtype] * 3


def test_vmap_of_grad(platform, rng):
    q, k, v = _qkv(rng, platform)
    cotangent = at.normal(rng, q.shape, q.dtype, platform)
    args = (_add_axis(rng, q, 1, 3, platform), k, _add_axis(rng, v, 3, 3, platform),
            _add_axis(rng, cotangent, 0, 3, platform))

    def transform(attention):
        grad = jax.grad(_loss(attention, is_causal=True), argnums=(0, 1, 2))
        return jax.vmap(grad, in_axes=(1, None, 3, 0), out_axes=(0, 2, 1))

    (dq, dk, dv), _, _ = at.check_transform(transform, args, platform, ops=("fwd", "bwd"))
    assert dq.shape == (3, *q.shape) and dk.shape == (*k.shape[:2], 3, *k.shape[2:])
    assert dv.shape == (v.shape[0], 3, *v.shape[1:])


def test_grad_of_vmap(platform, rng):
    q, k, v = _qkv(rng, platform)
    args = (_add_axis(rng, q, 2, 3, platform), _add_axis(rng, k, 2, 3, platform), v,
            _add_axis(rng, q, 2, 3, platform))

    def transform(attention):
        def loss(q, k, v, cotangent):
            out = jax.vmap(functools.partial(attention, local_window_size=(2, 8)), in_axes=(2, 2, None),
                           out_axes=2)(q, k, v)
            return jnp.sum(out * cotangent)

        return jax.grad(loss, argnums=(0, 1, 2))

    at.check_transform(transform, args, platform, ops=("fwd", "bwd"))


@pytest.mark.parametrize("policy", [None, "nothing_saveable", "dots_saveable"])
def test_checkpoint(platform, rng, policy):
    q, k, v = _qkv(rng, platform)
    cotangent = at.normal(rng, q.shape, q.dtype, platform)
    policy_fn = None if policy is None else getattr(jax.checkpoint_policies, policy)

    def transform(attention):
        def block(q, k, v):  # some work around the attention so rematerialisation has something to recompute
            return jnp.tanh(attention(jnp.sin(q), k * 2, v, is_causal=True))

        block = jax.checkpoint(block, policy=policy_fn)
        return jax.grad(lambda q, k, v, ct: jnp.sum(block(q, k, v) * ct), argnums=(0, 1, 2))

    at.check_transform(transform, (q, k, v, cotangent), platform, ops=("fwd", "bwd"))


@pytest.mark.parametrize("remat", [False, True], ids=["plain", "remat"])
def test_scan_over_layers(platform, rng, remat):
    """A small transformer-like stack under lax.scan: value and gradients w.r.t. the input and all layer weights."""
    layers = 3
    x = at.normal(rng, (BATCH, SEQ_Q, HEADS_Q, HEAD_DIM), jnp.float32, platform)
    weights = tuple(at.normal(rng, (layers, HEAD_DIM, HEAD_DIM), jnp.float32, platform, magnitude=HEAD_DIM ** -0.5)
                    for _ in range(3))
    cotangent = at.normal(rng, x.shape, jnp.float32, platform)

    def transform(attention):
        def layer(x, w):
            wq, wk, wv = w
            q = jnp.einsum("bshd,de->bshe", x, wq)
            kv_in = x[:, :, ::HEADS_Q // HEADS_KV]  # GQA: fewer kv heads
            k = jnp.einsum("bshd,de->bshe", kv_in, wk)
            v = jnp.einsum("bshd,de->bshe", kv_in, wv)
            return x + attention(q, k, v, is_causal=True), None

        body = jax.checkpoint(layer) if remat else layer

        def loss(x, wq, wk, wv, cotangent):
            y, _ = jax.lax.scan(body, x, (wq, wk, wv))
            return jnp.sum(y * cotangent)

        return jax.value_and_grad(loss, argnums=(0, 1, 2, 3))

    at.check_transform(transform, (x, *weights, cotangent), platform, ops=("fwd", "bwd"))


# ---------------------------------------------------------------------------------------------------------------------
# donation and 3-D inputs


def test_donated_buffers(platform, rng):
    q, k, v = _qkv(rng, platform)
    cotangent = at.normal(rng, q.shape, q.dtype, platform)
    args = (q, k, v, cotangent)
    kwargs = dict(is_causal=True)
    xla = jax.jit(at.fwd_and_vjp(**kwargs)(at.xla_attention(platform, q.dtype)))(*args)
    ref = jax.jit(at.fwd_and_vjp(**kwargs)(at.reference_attention))(*at.to_float64(args))

    fwd = jax.jit(functools.partial(jax_flash.dot_product_attention, **kwargs), donate_argnums=(0, 1, 2))
    grads = jax.jit(at.fwd_and_vjp(**kwargs)(at.flash_attention), donate_argnums=(0, 1, 2, 3))
    copies = [jnp.copy(x) for x in args]
    with warnings.catch_warnings():  # k and v cannot be reused for the single output: XLA warns, rightly
        warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
        at.assert_lowers_to_kernels(fwd.lower(q, k, v).as_text(), platform)
        out = fwd(*copies[:3])
    at.assert_lowers_to_kernels(grads.lower(*args).as_text(), platform, ("fwd", "bwd"))
    assert copies[0].is_deleted()  # the output has q's shape and dtype, so q's buffer is reused
    at.assert_rule(out, xla[0], ref[0])

    copies = [jnp.copy(x) for x in args]
    got = grads(*copies)
    assert all(c.is_deleted() for c in copies[:3])
    at.assert_trees_rule(got, xla, ref)


@pytest.mark.parametrize("heads_q,heads_kv", [(2, 2), (8, 2)])
def test_3d_inputs(platform, rng, heads_q, heads_kv):
    q, k, v = _qkv(rng, platform, batch=None, heads_q=heads_q, heads_kv=heads_kv)
    cotangent = at.normal(rng, q.shape, q.dtype, platform)
    (out, grads), _, _ = at.check_transform(at.fwd_and_vjp(local_window_size=(4, 3)), (q, k, v, cotangent),
                                            platform, ops=("fwd", "bwd"))
    assert out.shape == q.shape and [g.shape for g in grads] == [q.shape, k.shape, v.shape]
    # The same as the 4-D call with a batch of one.
    batched = jax_flash.dot_product_attention(q[None], k[None], v[None], local_window_size=(4, 3))
    np.testing.assert_array_equal(np.asarray(out), np.asarray(batched[0]))
