"""jax_flash.decode_attention and jax_flash.update_kv_cache against the float64 reference, on every platform.

Accuracy follows tests/attention_testing.py's rule: the float64 reference is decode_reference on float64 copies of
the (rounded) inputs, and the XLA baseline is decode_reference run in the input dtype on the same device (float32
compute, rounded like the kernels' output). Caches are filled with random data everywhere, past the lengths too,
so a kernel reading an entry it must not changes the result.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_flash
from attention_testing import DTYPES, assert_rule, normal, paged_copy, put, skip_if_unsupported, to_float64
from jax_flash.decode_reference import decode_reference


def lengths_for(rng, batch, max_len, q_len):
    """Ragged lengths including 0 and max_len, and one shorter than q_len (queries that see nothing) when room."""
    special = [0, max_len, max(q_len - 1, 0), min(q_len, max_len)]
    lengths = [special[i] if i < len(special) else int(rng.integers(0, max_len + 1)) for i in range(batch)]
    return np.asarray(rng.permutation(lengths), np.int32)


def decode_all(platform, q, k, v, lengths, page_table=None, **kwargs):
    """(jax_flash out and lse, XLA-baseline out, float64 reference out and lse)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    window = kwargs.get("local_window_size")
    window_left = -1 if window is None else window[0] if isinstance(window, tuple) else window
    ref_kwargs = dict(scale=scale, window_left=window_left,
                      softcap=kwargs.get("softcap") or 0.0)
    table = None if page_table is None else put(jnp.asarray(page_table), platform)
    lengths = put(jnp.asarray(lengths), platform)
    got = jax.jit(lambda *a: jax_flash.decode_attention(*a, page_table=table, return_lse=True, **kwargs))(
        q, k, v, lengths)
    xla = jax.jit(lambda *a: decode_reference(*a, page_table=table, **ref_kwargs))(q, k, v, lengths)
    ref = decode_reference(*to_float64((q, k, v)), np.asarray(lengths),
                           page_table=None if page_table is None else np.asarray(page_table), return_lse=True,
                           **ref_kwargs)
    return got, xla, ref


def check_against_reference(platform, q, k, v, lengths, page_table=None, **kwargs):
    (out, lse), xla, (ref, ref_lse) = decode_all(platform, q, k, v, lengths, page_table, **kwargs)
    assert_rule(out, xla, ref)
    lse, ref_lse = np.asarray(lse, np.float64), np.asarray(ref_lse, np.float64)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(ref_lse), err_msg="rows that see no key")
    finite = np.isfinite(ref_lse)
    np.testing.assert_allclose(lse[finite], ref_lse[finite], rtol=0, atol=64 * np.finfo(np.float32).eps *
                               max(1.0, np.max(np.abs(ref_lse[finite]), initial=1.0)))
    seen_nothing = np.isneginf(ref_lse)  # [B, H, q_len]
    assert np.all(np.asarray(out, np.float64).transpose(0, 2, 1, 3)[seen_nothing] == 0), "empty rows must be 0"
    return out


CASES = [
    # (batch, max_len, q_len, heads_q, heads_kv, head_dim, dtype, extra)
    (4, 77, 1, 8, 8, 128, "float32", {}),
    (4, 77, 1, 8, 2, 80, "bfloat16", {}),
    (5, 131, 1, 16, 2, 96, "float16", {}),
    (3, 64, 1, 8, 1, 256, "bfloat16", {}),
    (4, 50, 3, 8, 2, 128, "float32", {}),
    (4, 61, 16, 4, 1, 64, "bfloat16", {}),
    (4, 45, 16, 8, 1, 128, "float32", {}),
    (4, 99, 5, 4, 4, 256, "float32", {}),
    (4, 70, 2, 8, 2, 20, "float32", {}),
    (4, 93, 4, 8, 2, 128, "bfloat16", {"local_window_size": 9}),
    (4, 93, 1, 8, 8, 64, "float32", {"local_window_size": (30, 3)}),
    (4, 66, 3, 4, 1, 96, "float32", {"softcap": 2.5}),
    (4, 66, 2, 8, 2, 128, "float16", {"softcap": 5.0, "local_window_size": 17}),
    # CUDA stages rows 64, 128 or 256 wide: head dims below each width, and keys split across blocks
    (3, 150, 2, 8, 2, 32, "bfloat16", {}),
    (3, 120, 4, 8, 2, 48, "float16", {"local_window_size": 20}),
    (2, 2100, 1, 16, 4, 200, "float16", {"softcap": 10.0}),
    (2, 3000, 1, 8, 2, 256, "bfloat16", {}),
]


@pytest.mark.parametrize("batch,max_len,q_len,heads_q,heads_kv,head_dim,dtype,extra", CASES)
def test_matches_reference(platform, rng, batch, max_len, q_len, heads_q, heads_kv, head_dim, dtype, extra):
    check_random_case(platform, rng, batch, max_len, q_len, heads_q, heads_kv, head_dim, dtype, extra)


def check_random_case(platform, rng, batch, max_len, q_len, heads_q, heads_kv, head_dim, dtype, extra):
    """One of CASES' shapes on fresh random data, ragged lengths, against the reference."""
    skip_if_unsupported(platform, head_dim)
    dtype = DTYPES[dtype]
    q = normal(rng, (batch, q_len, heads_q, head_dim), dtype, platform)
    k = normal(rng, (batch, max_len, heads_kv, head_dim), dtype, platform)
    v = normal(rng, (batch, max_len, heads_kv, head_dim), dtype, platform)
    check_against_reference(platform, q, k, v, lengths_for(rng, batch, max_len, q_len), **extra)


def test_long_cache_is_split(platform, rng):
    """Long caches with few sequences take the split-KV path (several splits merged by their lse)."""
    q = normal(rng, (1, 1, 8, 128), jnp.bfloat16, platform)
    k = normal(rng, (1, 4099, 2, 128), jnp.bfloat16, platform)
    v = normal(rng, (1, 4099, 2, 128), jnp.bfloat16, platform)
    check_against_reference(platform, q, k, v, np.asarray([4001], np.int32))


@pytest.mark.parametrize("max_len", [40, 4099])  # one split, several splits merged by their lse
def test_nan_in_a_visible_entry_propagates(platform, rng, max_len):
    """A NaN key among a sequence's visible entries makes its queries' output and lse NaN (as jax.nn and
    dot_product_attention give), not 0; a NaN past the length is never read; other sequences are unaffected."""
    q = normal(rng, (3, 1, 4, 64), jnp.bfloat16, platform)
    k = np.array(normal(rng, (3, max_len, 2, 64), jnp.float32, platform))
    v = normal(rng, (3, max_len, 2, 64), jnp.bfloat16, platform)
    lengths = np.asarray([max_len, max_len - 10, 7], np.int32)
    k[0, max_len // 2, 0, 5] = np.nan  # visible: sequence 0, kv head 0 (query heads 0 and 1)
    k[1, max_len - 3, :, :] = np.nan  # past sequence 1's length
    k = put(jnp.asarray(k, jnp.bfloat16), platform)
    out, lse = jax.jit(lambda *a: jax_flash.decode_attention(*a, return_lse=True))(
        q, k, v, put(jnp.asarray(lengths), platform))
    out, lse = np.asarray(out, np.float32), np.asarray(lse)
    assert np.all(np.isnan(out[0, :, :2])) and np.all(np.isnan(lse[0, :2]))
    assert np.all(np.isfinite(out[0, :, 2:])) and np.all(np.isfinite(lse[0, 2:]))
    assert np.all(np.isfinite(out[1:])) and np.all(np.isfinite(lse[1:]))


@pytest.mark.parametrize("page_size,q_len,dtype", [(16, 1, "bfloat16"), (32, 4, "float32"), (64, 2, "float16")])
def test_paged_equals_contiguous(platform, rng, page_size, q_len, dtype):
    dtype = DTYPES[dtype]
    batch, pages_per_seq, heads_q, heads_kv, head_dim = 5, 5, 8, 2, 64
    max_len = pages_per_seq * page_size
    q = normal(rng, (batch, q_len, heads_q, head_dim), dtype, platform)
    k = normal(rng, (batch, max_len, heads_kv, head_dim), dtype, platform)
    v = normal(rng, (batch, max_len, heads_kv, head_dim), dtype, platform)
    lengths = lengths_for(rng, batch, max_len, q_len)
    (k_pool, v_pool), table = paged_copy(rng, (k, v), page_size)
    k_pool, v_pool = put(k_pool, platform), put(v_pool, platform)
    contiguous = check_against_reference(platform, q, k, v, lengths, local_window_size=40)
    paged = check_against_reference(platform, q, k_pool, v_pool, lengths, page_table=table, local_window_size=40)
    np.testing.assert_array_equal(np.asarray(paged), np.asarray(contiguous))


def test_lse_and_single_example(platform, rng):
    q = normal(rng, (2, 1, 4, 32), jnp.float32, platform)
    k = normal(rng, (2, 10, 4, 32), jnp.float32, platform)
    v = normal(rng, (2, 10, 4, 32), jnp.float32, platform)
    out, lse = jax_flash.decode_attention(q, k, v, jnp.asarray([10, 3]), return_lse=True)
    assert out.shape == q.shape and out.dtype == q.dtype and lse.shape == (2, 4, 1) and lse.dtype == jnp.float32
    # One query over a full cache is plain attention of the last position.
    expected = jax_flash.dot_product_attention(q[:1], k[:1], v[:1], implementation="xla")
    np.testing.assert_allclose(np.asarray(out[:1]), np.asarray(expected), atol=2e-6)


# ---------------------------------------------------------------------------------------------------------------------
# The cache update.


def numpy_update(k, new, positions, table=None):
    """Reference scatter of new [B, T, H, D] at positions[b] + t, dropping rows past the capacity."""
    k = np.array(k)
    for b in range(new.shape[0]):
        for t in range(new.shape[1]):
            j = int(positions[b]) + t
            if table is None:
                if 0 <= j < k.shape[1]:
                    k[b, j] = new[b, t]
            elif 0 <= j < table.shape[1] * k.shape[1]:
                k[table[b, j // k.shape[1]], j % k.shape[1]] = new[b, t]
    return k


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_update_kv_cache(platform, rng, paged, dtype):
    dtype = DTYPES[dtype]
    batch, new_len, heads, head_dim = 3, 4, 2, 40 if platform == "cpu" else 64
    if paged:
        k = normal(rng, (12, 16, heads, head_dim), dtype, platform)
        v = normal(rng, (12, 16, heads, head_dim), dtype, platform)
        table = rng.permutation(12)[:batch * 3].reshape(batch, 3).astype(np.int32)
        capacity = 48
    else:
        k = normal(rng, (batch, 37, heads, head_dim), dtype, platform)
        v = normal(rng, (batch, 37, heads, head_dim), dtype, platform)
        table, capacity = None, 37
    new_k = normal(rng, (batch, new_len, heads, head_dim), dtype, platform)
    new_v = normal(rng, (batch, new_len, heads, head_dim), dtype, platform)
    # Traced positions: the last sequence's rows run past the capacity and are dropped.
    positions = np.asarray([0, 15, capacity - 2], np.int32)
    table_arg = None if table is None else put(jnp.asarray(table), platform)
    update = jax.jit(lambda *a: jax_flash.update_kv_cache(*a, page_table=table_arg), donate_argnums=(0, 1))
    expected_k = numpy_update(np.asarray(k), np.asarray(new_k), positions, table)
    expected_v = numpy_update(np.asarray(v), np.asarray(new_v), positions, table)
    k2, v2 = update(k, v, new_k, new_v, put(jnp.asarray(positions), platform))
    np.testing.assert_array_equal(np.asarray(k2), expected_k)
    np.testing.assert_array_equal(np.asarray(v2), expected_v)


def test_update_aliases_the_cache(platform, rng):
    k = normal(rng, (2, 16, 1, 32), jnp.float32, platform)
    new = normal(rng, (2, 1, 1, 32), jnp.float32, platform)
    lowered = jax.jit(jax_flash.update_kv_cache, donate_argnums=(0, 1)).lower(k, k + 1, new, new, jnp.zeros(2, int))
    text = lowered.as_text()
    assert "jax_flash_kv_cache_update" in text and "output_operand_aliases" in text
    compiled = lowered.compile().as_text()
    assert "copy(" not in compiled.replace("copy-start", ""), "the cache should be updated without a copy"


def test_generation_loop(platform, rng):
    """Write one token, then attend, in a jitted fori_loop; equals attention over the prefix at every step."""
    batch, steps, heads_q, heads_kv, head_dim, max_len = 2, 9, 4, 2, 32, 16
    qs = normal(rng, (steps, batch, 1, heads_q, head_dim), jnp.float32, platform)
    ks = normal(rng, (steps, batch, 1, heads_kv, head_dim), jnp.float32, platform)
    vs = normal(rng, (steps, batch, 1, heads_kv, head_dim), jnp.float32, platform)
    start = jnp.asarray([0, 5], jnp.int32)

    @jax.jit
    def generate(k_cache, v_cache):
        def step(t, carry):
            k_cache, v_cache, outs = carry
            k_cache, v_cache = jax_flash.update_kv_cache(k_cache, v_cache, ks[t], vs[t], start + t)
            out = jax_flash.decode_attention(qs[t], k_cache, v_cache, start + t + 1)
            return k_cache, v_cache, outs.at[t].set(out)

        outs = jnp.zeros((steps, batch, 1, heads_q, head_dim), jnp.float32)
        return jax.lax.fori_loop(0, steps, step, (k_cache, v_cache, outs))[2]

    cache = normal(rng, (batch, max_len, heads_kv, head_dim), jnp.float32, platform)
    outs = generate(cache, cache)
    for b in range(batch):
        for t in range(steps):
            s = int(start[b])
            k = np.asarray(cache[b]).copy()
            v = k.copy()
            k[s:s + t + 1] = np.asarray(ks[:t + 1, b, 0])
            v[s:s + t + 1] = np.asarray(vs[:t + 1, b, 0])
            # Full float32 matmuls: XLA's GPU default (TF32) is itself off by ~1e-3.
            with jax.default_matmul_precision("highest"):
                expected = jax_flash.dot_product_attention(qs[t, b][None], k[None, :s + t + 1], v[None, :s + t + 1],
                                                           implementation="xla")
            np.testing.assert_allclose(np.asarray(outs[t, b]), np.asarray(expected[0]), atol=1e-5)


# ---------------------------------------------------------------------------------------------------------------------
# Transformations.


def test_vmap_matches_loop(platform, rng):
    n, batch, max_len, heads_q, heads_kv, head_dim = 3, 2, 48, 4, 2, 32
    q = normal(rng, (n, batch, 2, heads_q, head_dim), jnp.float32, platform)
    k = normal(rng, (n, batch, max_len, heads_kv, head_dim), jnp.float32, platform)
    v = normal(rng, (n, batch, max_len, heads_kv, head_dim), jnp.float32, platform)
    lengths = jnp.asarray(rng.integers(0, max_len + 1, (n, batch)), jnp.int32)
    got = jax.jit(jax.vmap(jax_flash.decode_attention))(q, k, v, lengths)
    for i in range(n):
        np.testing.assert_allclose(np.asarray(got[i]), np.asarray(jax_flash.decode_attention(q[i], k[i], v[i],
                                                                                            lengths[i])), atol=1e-6)
    # A shared paged pool with per-instance page tables, and per-instance pools.
    pool_k = normal(rng, (8, 16, heads_kv, head_dim), jnp.float32, platform)
    pool_v = normal(rng, (8, 16, heads_kv, head_dim), jnp.float32, platform)
    tables = jnp.asarray(np.stack([rng.permutation(8)[:batch * 3].reshape(batch, 3) for _ in range(n)]), jnp.int32)
    shared = jax.vmap(lambda q, t, n_: jax_flash.decode_attention(q, pool_k, pool_v, n_, page_table=t))(
        q, tables, lengths)
    own = jax.vmap(lambda q, pk, pv, t, n_: jax_flash.decode_attention(q, pk, pv, n_, page_table=t))(
        q, jnp.stack([pool_k] * n), jnp.stack([pool_v] * n), tables, lengths)
    for i in range(n):
        expected = jax_flash.decode_attention(q[i], pool_k, pool_v, lengths[i], page_table=tables[i])
        np.testing.assert_allclose(np.asarray(shared[i]), np.asarray(expected), atol=1e-6)
        np.testing.assert_allclose(np.asarray(own[i]), np.asarray(expected), atol=1e-6)


def test_vmap_update(platform, rng):
    n, batch, heads, head_dim = 2, 2, 1, 16
    k = normal(rng, (n, batch, 20, heads, head_dim), jnp.float32, platform)
    new = normal(rng, (n, batch, 3, heads, head_dim), jnp.float32, platform)
    positions = jnp.asarray([[0, 4], [7, 17]], jnp.int32)
    k2, v2 = jax.jit(jax.vmap(jax_flash.update_kv_cache))(k, k, new, new, positions)
    for i in range(n):
        expected = numpy_update(np.asarray(k[i]), np.asarray(new[i]), np.asarray(positions[i]))
        np.testing.assert_array_equal(np.asarray(k2[i]), expected)
        np.testing.assert_array_equal(np.asarray(v2[i]), expected)


def test_out_of_range_values_are_clamped_when_traced(platform, rng):
    """Traced lengths past the capacity act as the capacity, negative ones as 0; page ids clamp to the pool."""
    q = normal(rng, (3, 1, 2, 16), jnp.float32, platform)
    k = normal(rng, (3, 20, 2, 16), jnp.float32, platform)
    got = jax.jit(jax_flash.decode_attention)(q, k, k, jnp.asarray([25, -3, 7]))
    expected = jax_flash.decode_attention(q, k, k, jnp.asarray([20, 0, 7]))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))
    pool = normal(rng, (4, 16, 2, 16), jnp.float32, platform)
    table = jnp.asarray([[0, 9], [-1, 1], [2, 3]], jnp.int32)
    got = jax.jit(lambda t: jax_flash.decode_attention(q, pool, pool, jnp.asarray([32, 32, 32]), page_table=t))(table)
    expected = jax_flash.decode_attention(q, pool, pool, jnp.asarray([32, 32, 32]),
                                          page_table=jnp.clip(table, 0, 3))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))


def test_lowers_to_the_decode_kernel(platform, rng):
    from attention_testing import KERNEL_PLATFORM

    q = normal(rng, (1, 1, 2, 16), jnp.float32, platform)
    k = normal(rng, (1, 8, 2, 16), jnp.float32, platform)
    text = jax.jit(jax_flash.decode_attention).lower(q, k, k, jnp.asarray([3])).as_text()
    assert f"jax_flash_decode_{KERNEL_PLATFORM[platform]}" in text
    # On CUDA the split partials' workspace is a third result that XLA allocates (1 element: 8 keys are one split).
    results = "(tensor<1x1x2x16xf32>, tensor<1x2x1xf32>" + (", tensor<1xf32>)" if platform == "gpu" else ")")
    assert f"-> {results}" in text


def test_cuda_workspace_covers_the_splits():
    """The CUDA workspace, sized at trace time, holds the partials of as many splits as the planner may choose: one
    per 256 keys up to 128, while fewer than 1024 blocks of 16 packed query rows fill the GPU."""
    from jax_flash._decode_primitives import decode_workspace_elements

    per_split = 32 * 129  # one query token, 32 heads of 128: lse and output per row
    assert decode_workspace_elements((1, 1, 32, 128), 8, 131072) == 128 * per_split  # 8 items
    assert decode_workspace_elements((8, 1, 32, 128), 8, 4096) == 16 * 8 * per_split  # 64 items: 1024 / 64
    assert decode_workspace_elements((8, 1, 32, 128), 8, 1000) == 4 * 8 * per_split  # 4 splits of >= 256 keys
    assert decode_workspace_elements((128, 1, 32, 128), 8, 2048) == 1  # 1024 items fill any GPU unsplit
    assert decode_workspace_elements((2, 16, 32, 128), 1, 4096) == 16 * 2 * 16 * 32 * 129  # 32 passes of 16 rows


def test_unrolled_calls_in_one_program(platform, rng):
    """Several decode calls and cache updates in one jitted program, not in a loop (what XLA's command buffers would
    capture into one CUDA graph). Each step's query is its own (no result feeds the next step's query, whose rounding
    XLA may fuse differently), so the steps must match one call at a time exactly."""
    queries = [normal(rng, (2, 1, 8, 128), jnp.bfloat16, platform) for _ in range(4)]
    k = normal(rng, (2, 3000, 2, 128), jnp.bfloat16, platform)
    v = normal(rng, (2, 3000, 2, 128), jnp.bfloat16, platform)
    lengths = np.asarray([2996, 1700], np.int32)

    @jax.jit
    def steps(queries, k, v, lengths):
        outs = []
        for step, q in enumerate(queries):
            k, v = jax_flash.update_kv_cache(k, v, q[:, :, :2], q[:, :, 2:4], lengths + step - 1)
            outs.append(jax_flash.decode_attention(q, k, v, lengths + step))
        return outs, k

    outs, k_final = steps(queries, k, v, jnp.asarray(lengths))
    for step, q in enumerate(queries):
        k, v = jax_flash.update_kv_cache(k, v, q[:, :, :2], q[:, :, 2:4], jnp.asarray(lengths + step - 1))
        out = check_against_reference(platform, q, k, v, lengths + step)
        np.testing.assert_array_equal(np.asarray(outs[step], np.float32), np.asarray(out, np.float32))
    np.testing.assert_array_equal(np.asarray(k_final, np.float32), np.asarray(k, np.float32))


# ---------------------------------------------------------------------------------------------------------------------
# Bad input: clear errors at trace time.

Q = jnp.zeros((2, 1, 4, 16), jnp.float32)
K = jnp.zeros((2, 32, 2, 16), jnp.float32)
POOL = jnp.zeros((6, 16, 2, 16), jnp.float32)
TABLE = jnp.asarray([[0, 1], [2, 3]], jnp.int32)
LENGTHS = jnp.asarray([3, 4], jnp.int32)


@pytest.mark.parametrize("call,error,match", [
    (lambda: jax_flash.decode_attention(Q[0], K, K, LENGTHS), ValueError, "query must have rank 4"),
    (lambda: jax_flash.decode_attention(Q.astype(jnp.int32), K, K, LENGTHS), TypeError, "query has dtype"),
    (lambda: jax_flash.decode_attention(Q, K, K[:, :8], LENGTHS), ValueError, "same shape"),
    (lambda: jax_flash.decode_attention(Q, K.astype(jnp.bfloat16), K.astype(jnp.bfloat16), LENGTHS), TypeError,
     "same dtype"),
    (lambda: jax_flash.decode_attention(Q, K[:1], K[:1], LENGTHS), ValueError, "batch size"),
    (lambda: jax_flash.decode_attention(Q[..., :3, :], K, K, LENGTHS), ValueError, "multiple of the number of kv"),
    (lambda: jax_flash.decode_attention(Q, K, K, jnp.asarray([3, 33])), ValueError, "cache_lengths must lie in"),
    (lambda: jax_flash.decode_attention(Q, K, K, jnp.asarray([3.0, 3.0])), TypeError, "cache_lengths must have an "
     "integer dtype"),
    (lambda: jax_flash.decode_attention(Q, K, K, jnp.asarray([3])), ValueError, "cache_lengths must have shape"),
    (lambda: jax_flash.decode_attention(Q, POOL, POOL, LENGTHS, page_table=jnp.asarray([[0, 6], [1, 2]])),
     ValueError, "page_table must lie in"),
    (lambda: jax_flash.decode_attention(Q, POOL[:, :8], POOL[:, :8], LENGTHS, page_table=TABLE), ValueError,
     "multiple of 16"),
    (lambda: jax_flash.decode_attention(Q, POOL, POOL, LENGTHS, page_table=TABLE[:1]), ValueError,
     "page_table must have shape"),
    (lambda: jax_flash.decode_attention(Q, K, K, LENGTHS, local_window_size=-1), ValueError, "non-negative"),
    (lambda: jax_flash.decode_attention(Q, K, K, LENGTHS, softcap=-1.0), ValueError, "softcap"),
    (lambda: jax_flash.update_kv_cache(K, K, K[:, :2, :1], K[:, :2, :1], LENGTHS), ValueError, "new_k must have "
     "shape"),
    (lambda: jax_flash.update_kv_cache(K, K, K[:, :2].astype(jnp.bfloat16), K[:, :2], LENGTHS), TypeError,
     "new_k must have the caches' dtype"),
    (lambda: jax_flash.update_kv_cache(K, K, K[:, :2], K[:, :2], jnp.asarray([0, 31])), ValueError,
     "positions must lie in"),
])
def test_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()
