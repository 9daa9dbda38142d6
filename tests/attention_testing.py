"""Helpers of the jax_flash test suite: random inputs, the three implementations compared, and the tolerance rule.

The tolerance rule (used for every numerical comparison with the reference), per output array:

    rms(x)  = sqrt(mean((x - ref)**2))           (relative-norm error: the 2-norm of the error over sqrt(size))
    rms(jax_flash) <= 2 * rms(XLA) + 4 * eps(dtype) * RMS(ref)                   (the rule)
    max|jax_flash - ref| <= 4 * max|XLA - ref| + 16 * eps(dtype) * MAX(ref)      (a looser max-abs guard)

where ref is the float64 reference computed from the *same* (already rounded) low-precision inputs (float64 copies of
them), RMS(ref) = sqrt(mean(ref**2)), MAX(ref) = max|ref|, and XLA is
jax.nn.dot_product_attention(implementation='xla') run in the same dtype on the same device under the same
transformation, its float32 matmuls at "highest" precision (GPUs would otherwise use TF32, a far weaker baseline).
Where jax.nn cannot serve as that baseline -- softcap (jax.nn has no such argument) or float16 on CPU (XLA:CPU rejects
the F16_F16_F32 dot algorithm that jax.nn asks for, in its gradient) -- the baseline is
jax_flash.dot_product_attention(..., implementation='xla') on the same-dtype inputs, which computes in float32 and
rounds to the input dtype.

Why both: the 2x rule is stated on the norm error because a max over thousands of rounding errors is a noisy statistic
(flash's float32 gradients show max-abs ratios of 3-5x XLA's for one element while their norm errors are within
1.1-2x); the max-abs guard still catches a localised error (one wrong row) that the norm would dilute.

When a reference array is identically zero (dq and dk when every row sees a single key: softmax is constant there) the
kernel's result is the rounding residue of a cancellation between O(1) terms; RMS(ref) and MAX(ref) are then taken
over the other arrays of the same computation (e.g. out and dv).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

import jax_flash
from jax_flash.reference import attention_reference

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
KERNEL_PLATFORM = {"cpu": "cpu", "gpu": "cuda"}
CUDA_HEAD_DIM_MULTIPLE = 8


def eps(dtype) -> float:
    return float(jnp.finfo(dtype).eps)


def device(platform: str):
    return jax.devices(platform)[0]


def put(x, platform: str):
    return jax.device_put(x, device(platform))


def skip_if_unsupported(platform: str, head_dim: int):
    """The CUDA kernels take head_dim multiples of 8 only (other sizes raise, tested in test_errors)."""
    import pytest

    if platform == "gpu" and head_dim % CUDA_HEAD_DIM_MULTIPLE:
        pytest.skip(f"head_dim={head_dim} is not a multiple of {CUDA_HEAD_DIM_MULTIPLE} (CUDA kernels)")


def normal(rng: np.random.Generator, shape, dtype, platform: str, magnitude: float = 1.0):
    """Standard-normal data (times magnitude) rounded to dtype, placed on platform's first device."""
    x = magnitude * rng.standard_normal(shape)
    return put(jnp.asarray(x, dtype=dtype), platform)


def paged_copy(rng, caches, page_size, extra_pages=3):
    """Caches [B, M, H, D] (M a multiple of page_size) scattered over shuffled pools, with spare random pages.

    Returns the pools (one per cache) and the page table they share."""
    batch, max_len = caches[0].shape[:2]
    pages_per_seq = max_len // page_size
    num_pages = batch * pages_per_seq + extra_pages
    table = rng.permutation(num_pages)[:batch * pages_per_seq].reshape(batch, pages_per_seq).astype(np.int32)
    pools = []
    for cache in caches:
        pool = np.array(jnp.asarray(rng.standard_normal((num_pages, page_size, *cache.shape[2:])), cache.dtype)
                        .astype(jnp.float32))
        pool[table] = np.asarray(cache.astype(jnp.float32)).reshape(batch, pages_per_seq, page_size,
                                                                    *cache.shape[2:])
        pools.append(jnp.asarray(pool, cache.dtype))
    return pools, table


def random_qkv(rng, platform, *, seq_q, seq_k, heads_q, heads_kv, head_dim, dtype, batch=2, magnitude=1.0):
    """query [batch, seq_q, heads_q, head_dim], key/value [batch, seq_k, heads_kv, head_dim] (3-D if batch is None)."""
    lead = () if batch is None else (batch,)
    q = normal(rng, (*lead, seq_q, heads_q, head_dim), dtype, platform, magnitude)
    k = normal(rng, (*lead, seq_k, heads_kv, head_dim), dtype, platform, magnitude)
    v = normal(rng, (*lead, seq_k, heads_kv, head_dim), dtype, platform, magnitude)
    return q, k, v


def to_float64(tree):
    """Every floating leaf as a float64 array on the CPU (exactly representing the rounded low-precision values)."""

    def convert(x):
        x = np.asarray(x)
        if np.issubdtype(x.dtype, np.floating) or x.dtype == jnp.bfloat16:
            x = x.astype(np.float64)
        return jax.device_put(x, device("cpu"))

    return jax.tree.map(convert, tree)


# ---------------------------------------------------------------------------------------------------------------------
# The three implementations, all with jax.nn.dot_product_attention's signature (the arguments jax_flash supports).


def window_bounds(is_causal, local_window_size):
    """(left, right) visible offsets j - i in [-left, right], -1 = unbounded; written independently of jax_flash."""
    left = right = -1
    if local_window_size is not None:
        left, right = ((local_window_size, local_window_size) if isinstance(local_window_size, int)
                       else local_window_size)
    if is_causal:
        right = 0 if right < 0 else min(right, 0)
    return left, right


def reference_attention(query, key, value, *, scale=None, is_causal=False, local_window_size=None, softcap=None):
    """float64 reference: jax_flash.attention_reference on float64 copies of the inputs (3-D or 4-D)."""
    unbatched = query.ndim == 3
    q, k, v = (jnp.asarray(x, jnp.float64) for x in (query, key, value))
    if unbatched:
        q, k, v = q[None], k[None], v[None]
    left, right = window_bounds(is_causal, local_window_size)
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    out = attention_reference(q, k, v, scale=scale, window_left=left, window_right=right,
                              softcap=0.0 if softcap is None else softcap)
    return out[0] if unbatched else out


def visible_mask(seq_q: int, seq_k: int, left: int, right: int) -> np.ndarray:
    """[seq_q, seq_k] bool: query i sees key j when i - left <= j <= i + right (negative bound: unbounded)."""
    i = np.arange(seq_q)[:, None]
    j = np.arange(seq_k)[None, :]
    visible = np.ones((seq_q, seq_k), bool)
    if left >= 0:
        visible &= j >= i - left
    if right >= 0:
        visible &= j <= i + right
    return visible


def numpy_probabilities(q, k, *, scale, is_causal=False, local_window_size=None, softcap=None, visible=None):
    """float64 (raw scaled scores, logits, softmax probabilities), each [batch, heads_kv, group, seq_q, seq_k]; masked
    logits are -inf and rows that see no key have all-zero probabilities."""
    q, k = (np.asarray(x, np.float64) for x in (q, k))
    batch, seq_q, heads_q, head_dim = q.shape
    seq_k, heads_kv = k.shape[1], k.shape[2]
    left, right = window_bounds(is_causal, local_window_size)
    visible = visible_mask(seq_q, seq_k, left, right) if visible is None else visible[:, None, None]
    qg = q.reshape(batch, seq_q, heads_kv, heads_q // heads_kv, head_dim)  # query head h reads kv head h // group
    raw = np.einsum("bthgd,bshd->bhgts", qg, k, optimize=True) * scale
    logits = softcap * np.tanh(raw / softcap) if softcap else raw
    logits = np.where(visible, logits, -np.inf)
    row_max = logits.max(axis=-1, keepdims=True)
    weights = np.exp(logits - np.where(np.isfinite(row_max), row_max, 0.0))
    row_sum = weights.sum(axis=-1, keepdims=True)
    return raw, logits, weights / np.where(row_sum > 0, row_sum, 1.0)


def numpy_attention(q, k, v, cotangent=None, *, scale=None, is_causal=False, local_window_size=None, softcap=None,
                    visible=None):
    """Independent float64 numpy attention (4-D inputs). Returns out, or (out, (dq, dk, dv)) given a cotangent,
    the gradients of sum(out * cotangent) derived by hand. Rows that see no key give 0 and zero gradients.
    visible, [batch, seq_q, seq_k] bool, replaces the mask of is_causal and local_window_size when given."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    raw, _, probs = numpy_probabilities(q, k, scale=scale, is_causal=is_causal, local_window_size=local_window_size,
                                        softcap=softcap, visible=visible)
    qg = q.reshape(*q.shape[:2], k.shape[2], -1, q.shape[-1])  # query head h reads kv head h // group
    out = np.einsum("bhgts,bshd->bthgd", probs, v, optimize=True).reshape(q.shape)
    if cotangent is None:
        return out

    dout = np.asarray(cotangent, np.float64).reshape(qg.shape)
    dv = np.einsum("bhgts,bthgd->bshd", probs, dout, optimize=True)
    dprobs = np.einsum("bthgd,bshd->bhgts", dout, v, optimize=True)
    dlogits = probs * (dprobs - np.sum(dprobs * probs, axis=-1, keepdims=True))
    if softcap:
        dlogits = dlogits * (1.0 - np.tanh(raw / softcap) ** 2)
    draw = dlogits * scale
    dq = np.einsum("bhgts,bshd->bthgd", draw, k, optimize=True).reshape(q.shape)
    dk = np.einsum("bhgts,bthgd->bshd", draw, qg, optimize=True)
    return out, (dq, dk, dv)


def xla_attention(platform: str, dtype):
    """The XLA baseline in `dtype` on `platform` (see the module docstring for when jax.nn is replaced)."""
    jax_nn_ok = not (platform == "cpu" and jnp.dtype(dtype) == jnp.float16)

    def attention(query, key, value, *, softcap=None, **kwargs):
        # float32 matmuls in true float32 (GPUs would default to TF32, a far weaker baseline); the precision is read
        # when the dots are traced, so the context covers jit and the transposes of autodiff alike.
        with jax.default_matmul_precision("highest"):
            if softcap is not None or not jax_nn_ok:
                return jax_flash.dot_product_attention(query, key, value, softcap=softcap, implementation="xla",
                                                       **kwargs)
            return jax.nn.dot_product_attention(query, key, value, implementation="xla", **kwargs)

    return attention


def flash_attention(query, key, value, **kwargs):
    return jax_flash.dot_product_attention(query, key, value, **kwargs)


# ---------------------------------------------------------------------------------------------------------------------
# Running and comparing.


def kernel_targets(platform: str, ops=("fwd",)):
    return [f"jax_flash_attention_{op}_{KERNEL_PLATFORM[platform]}" for op in ops]


def assert_lowers_to_kernels(lowered_text: str, platform: str, ops=("fwd",)):
    for target in kernel_targets(platform, ops):
        assert target in lowered_text, f"{target} is not called by the lowered computation"


def run_flash_checked(fn, args, platform, ops=("fwd",), **jit_kwargs):
    """jit(fn)(*args), after checking that its lowering calls jax_flash's kernels `ops` on `platform`."""
    lowered = jax.jit(fn, **jit_kwargs).lower(*args)
    assert_lowers_to_kernels(lowered.as_text(), platform, ops)
    return lowered.compile()(*args)


def max_abs(x) -> float:
    x = np.asarray(x, dtype=np.float64)
    return float(np.max(np.abs(x))) if x.size else 0.0


def rms(x) -> float:
    x = np.asarray(x, dtype=np.float64)
    return float(np.sqrt(np.mean(np.square(x)))) if x.size else 0.0


def _as_float64(actual, xla, ref, what):
    actual_np = np.asarray(actual).astype(np.float64)
    xla_np = np.asarray(xla).astype(np.float64)
    ref_np = np.asarray(ref).astype(np.float64)
    assert actual_np.shape == xla_np.shape == ref_np.shape, (
        f"{what}: shapes {actual_np.shape} (jax_flash), {xla_np.shape} (XLA), {ref_np.shape} (reference)")
    assert actual.dtype == xla.dtype, f"{what}: dtype {actual.dtype}, expected {xla.dtype}"
    assert np.all(np.isfinite(actual_np)), f"{what}: {np.sum(~np.isfinite(actual_np))} non-finite values"
    return actual_np, xla_np, ref_np


def assert_max_abs_guard(actual, xla, ref, *, max_scale=None, what="output"):
    """max|jax_flash - ref| <= 4 * max|XLA - ref| + 16 * eps * max_scale (default max|ref|); finite, same dtype."""
    actual_np, xla_np, ref_np = _as_float64(actual, xla, ref, what)
    max_scale = max_abs(ref_np) if max_scale is None else max_scale
    max_err, max_err_xla = max_abs(actual_np - ref_np), max_abs(xla_np - ref_np)
    max_bound = 4 * max_err_xla + 16 * eps(actual.dtype) * max_scale
    assert max_err <= max_bound, (
        f"{what}: max-abs error {max_err:.3e} vs the float64 reference exceeds {max_bound:.3e} = 4 * XLA's "
        f"{max_err_xla:.3e} + 16 eps * {max_scale:.3e} (dtype {actual.dtype}); at index "
        f"{np.unravel_index(np.argmax(np.abs(actual_np - ref_np)), actual_np.shape)}")


def assert_rule(actual, xla, ref, *, rms_scale=None, max_scale=None, what="output"):
    """The module's tolerance rule on one array; also checks shape, dtype (against the XLA baseline) and finiteness.

    rms_scale / max_scale replace RMS(ref) / MAX(ref) where the caller knows better (an all-zero reference)."""
    actual_np, xla_np, ref_np = _as_float64(actual, xla, ref, what)
    rms_scale = rms(ref_np) if rms_scale is None else rms_scale
    err, err_xla = rms(actual_np - ref_np), rms(xla_np - ref_np)
    bound = 2 * err_xla + 4 * eps(actual.dtype) * rms_scale
    assert err <= bound, (f"{what}: RMS error {err:.3e} vs the float64 reference exceeds {bound:.3e} = 2 * XLA's "
                          f"{err_xla:.3e} + 4 eps * {rms_scale:.3e} (dtype {actual.dtype})")
    assert_max_abs_guard(actual, xla, ref, max_scale=max_scale, what=what)
    return err, err_xla


def assert_trees_rule(actual, xla, ref):
    """assert_rule on every leaf; all-zero reference leaves take their scales from the other leaves."""
    leaves_a, tree_a = jax.tree.flatten(actual)
    leaves_x, tree_x = jax.tree.flatten(xla)
    leaves_r, tree_r = jax.tree.flatten(ref)
    assert tree_a == tree_x == tree_r, (tree_a, tree_x, tree_r)
    assert leaves_a, "nothing to compare"
    tree_rms = max(rms(r) for r in leaves_r)
    tree_max = max(max_abs(r) for r in leaves_r)
    for i, (a, x, r) in enumerate(zip(leaves_a, leaves_x, leaves_r)):
        zero = max_abs(r) == 0
        assert_rule(a, x, r, rms_scale=tree_rms if zero else None, max_scale=tree_max if zero else None,
                    what=f"leaf {i} of {tree_a}")


def check_transform(transform, args, platform, *, ops=("fwd",), dtype=None):
    """Compares transform(jax_flash) with transform(XLA) and transform(float64 reference) under the tolerance rule.

    transform maps an attention function (jax.nn's signature) to a function of `args`; the jax_flash version is
    jitted after checking that its lowering calls the kernels `ops`, the others are jitted plainly. Returns the three
    results (jax_flash, XLA, reference).
    """
    dtype = dtype if dtype is not None else args[0].dtype
    got = run_flash_checked(transform(flash_attention), args, platform, ops)
    xla = jax.jit(transform(xla_attention(platform, dtype)))(*args)
    ref = jax.jit(transform(reference_attention))(*to_float64(args))
    assert_trees_rule(got, xla, ref)
    return got, xla, ref


def fwd_and_vjp_all(q, k, v, cotangent, platform, **kwargs):
    """(jax_flash, XLA baseline, float64 numpy reference) results of out and (dq, dk, dv); jax_flash's lowering is
    checked to call the fwd and bwd kernels."""
    transform = fwd_and_vjp(**kwargs)
    args = (q, k, v, cotangent)
    got = run_flash_checked(transform(flash_attention), args, platform, ops=("fwd", "bwd"))
    xla = jax.jit(transform(xla_attention(platform, q.dtype)))(*args)
    ref = numpy_attention(*(np.asarray(x).astype(np.float64) for x in args), **kwargs)
    return got, xla, ref


def check_fwd_and_vjp(q, k, v, cotangent, platform, **kwargs):
    """out and (dq, dk, dv) of jax_flash vs the XLA baseline and the float64 numpy reference, under the rule."""
    got, xla, ref = fwd_and_vjp_all(q, k, v, cotangent, platform, **kwargs)
    assert_trees_rule(got, xla, ref)
    return got


def fwd_and_vjp(**kwargs):
    """transform: attention -> f(q, k, v, cotangent) = (out, (dq, dk, dv)), i.e. gradients of sum(out * cotangent)."""

    def transform(attention):
        def f(q, k, v, cotangent):
            out, vjp = jax.vjp(functools.partial(attention, **kwargs), q, k, v)
            return out, vjp(cotangent)

        return f

    return transform
