"""A small matrix of attention calls for compute-sanitizer (memcheck, racecheck) on a GPU:

    compute-sanitizer --tool memcheck --error-exitcode 1 python tests/gpu_sanitizer_matrix.py
    compute-sanitizer --tool racecheck --error-exitcode 1 python tests/gpu_sanitizer_matrix.py
    compute-sanitizer --tool racecheck --error-exitcode 1 python tests/gpu_sanitizer_matrix.py --groups tokens,decode

(--groups picks some of dense, long, tokens, decode and fp8, run in the order named: racecheck over the whole matrix
can outlast one device call.)

Odd lengths (partial tiles at both ends), every head-dim bucket plus padded head dims, causal, windows, softcap, GQA
and Sq != Sk, forward and backward, fp16 and bf16, then token masks (segment ids, positions, lengths) that leave
tiles empty, partial and full. The last case of each list has more work tiles than an H200 has SMs (132): the token
one 144, so some CTAs of the persistent Hopper forward take two, and the dense one 288, so some take three and load
a query buffer (of the two) a second time; they are kept small because racecheck's cost grows with every
shared-memory access. Then decode: contiguous and paged caches written by update_kv_cache (rows aimed past the
capacity among them, which it drops), ragged lengths from 0 to the capacity, q_len 1 to 4, GQA, a window and a
softcap, and one cache long enough for the key axis to be split across blocks. Every cache entry past a sequence's
length holds a zero key and a value of 60000: attention output is a convex combination of the values it reads, so a
read of such an entry shows as an output beyond the valid values' range.
Exits non-zero if a result is not finite (or, for decode, out of that range).
"""

from __future__ import annotations

import argparse
import itertools
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jax_flash
from attention_testing import paged_copy

CASES = [
    # (seq_q, seq_k, heads_q, heads_kv, head_dim, is_causal, window, softcap)
    (17, 113, 4, 1, 32, False, None, None),
    (113, 17, 2, 2, 64, True, None, None),
    (1, 200, 4, 2, 80, False, (16, 0), None),
    (130, 130, 4, 4, 96, True, None, 20.0),
    (77, 190, 8, 2, 128, False, (40, 7), None),
    (190, 77, 2, 1, 160, True, None, None),
    (65, 129, 2, 2, 192, False, None, 5.0),
    (129, 65, 4, 2, 256, True, (30, 0), None),
    (384, 384, 48, 8, 64, True, None, None),
]

# Long enough (seq_q >= 2048) for the Hopper kernels chosen only on long rows: the backward that accumulates dq inside
# its dk/dv kernel (head dims 65..128) and the 192-row forward at head dim 64 (2049 rows leave its last tile with 129).
# Their own group because one such case under racecheck costs as much as the whole dense group.
LONG_CASES = [
    (2049, 2063, 2, 1, 128, True, None, None),
    (2049, 2049, 2, 2, 64, False, None, None),
]

# The FP8 forward (Hopper kernel at head dims 16..128 in 16s, with its transpose of v): odd lengths, GQA, a window,
# lengths that leave rows empty.
FP8_CASES = [
    # (seq_q, seq_k, heads_q, heads_kv, head_dim, is_causal, window, mask arguments)
    (113, 1000, 4, 2, 128, True, None, None),
    (1, 77, 2, 1, 80, False, (30, 0), None),
    (129, 257, 4, 1, 128, False, None, "lengths"),
]

TOKEN_CASES = [
    # (seq_q, seq_k, heads_q, heads_kv, head_dim, is_causal, window, mask arguments)
    (300, 300, 4, 2, 64, True, None, "segments"),
    (129, 257, 4, 1, 128, False, None, "lengths"),
    (250, 250, 2, 2, 256, True, (40, 0), "segments+positions"),
    (256, 256, 36, 6, 128, True, None, "segments"),
]


DECODE_CASES = [
    # (capacity, heads_q, heads_kv, head_dim, q_len, page_size or None for a contiguous cache, window, softcap)
    (200, 8, 2, 128, 1, None, None, None),
    (336, 4, 4, 64, 4, None, (50, 0), None),
    (256, 8, 1, 256, 3, 16, None, 30.0),
    (4096, 32, 8, 128, 1, 64, None, None),
    (2496, 8, 2, 200, 1, 32, None, None),
    (1000, 16, 4, 32, 2, None, (300, 0), None),
]


def token_arguments(kind: str, seq_q: int, seq_k: int) -> dict:
    """Three documents per row with padding after them (a segment of its own), or per-row lengths."""
    if kind == "lengths":
        return {"query_seq_lengths": jnp.array([seq_q, seq_q // 3], jnp.int32),
                "key_value_seq_lengths": jnp.array([seq_k // 2, 0], jnp.int32)}
    cuts = np.array([0, seq_q // 5, seq_q // 2, seq_q - 7, seq_q])
    ids = np.repeat(np.arange(4), np.diff(cuts)).astype(np.int32)
    arguments = {"segment_ids": jnp.asarray(np.stack([ids, ids[::-1]]))}
    if kind == "segments+positions":
        positions = np.arange(seq_q) - np.repeat(cuts[:-1], np.diff(cuts))
        arguments["segment_positions"] = jnp.asarray(np.stack([positions, positions]).astype(np.int32))
    return arguments


GROUPS = ("dense", "long", "tokens", "decode", "fp8")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", default=",".join(GROUPS),
                        help=f"comma-separated, of {', '.join(GROUPS)} (default: all)")
    groups = parser.parse_args(argv).groups.split(",")
    if unknown := set(groups) - set(GROUPS):
        parser.error(f"unknown groups {sorted(unknown)}; choose from {', '.join(GROUPS)}")
    failures = 0
    for group in groups:  # in the order given, so a time-limited run reaches the group named first
        if group == "fp8":
            failures += sum(not fp8_output_is_finite(case) for case in FP8_CASES)
        elif group == "decode":
            failures += sum(not decode_reads_only_valid_entries(*case) for case in with_dtypes(DECODE_CASES))
        else:
            cases = {"dense": CASES, "long": LONG_CASES,
                     "tokens": [(*case[:6], case[6], None, case[7]) for case in TOKEN_CASES]}[group]
            failures += sum(not gradients_are_finite(*case) for case in with_dtypes(cases))
    return 1 if failures else 0


def with_dtypes(cases):
    return itertools.product(cases, (jnp.bfloat16, jnp.float16))


def gradients_are_finite(case, dtype) -> bool:
    """Forward and backward of one attention case (with token masks when its ninth entry names them)."""
    seq_q, seq_k, heads_q, heads_kv, head_dim, is_causal, window, softcap, *tokens = case
    tokens = tokens[0] if tokens else None
    mask_arguments = token_arguments(tokens, seq_q, seq_k) if tokens else {}
    keys = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(keys[0], (2, seq_q, heads_q, head_dim), dtype)
    k = jax.random.normal(keys[1], (2, seq_k, heads_kv, head_dim), dtype)
    v = jax.random.normal(keys[2], (2, seq_k, heads_kv, head_dim), dtype)

    def loss(q, k, v):
        out = jax_flash.dot_product_attention(q, k, v, is_causal=is_causal, local_window_size=window,
                                              softcap=softcap, **mask_arguments)
        return jnp.sum(out.astype(jnp.float32) ** 2)

    value, grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(q, k, v)
    finite = np.isfinite(float(value)) and all(np.all(np.isfinite(np.asarray(g, np.float32))) for g in grads)
    print(case, jnp.dtype(dtype).name, "ok" if finite else "NOT FINITE", flush=True)
    return finite


def fp8_output_is_finite(case) -> bool:
    """The FP8 forward on e4m3 inputs with scales that map standard-normal data onto e4m3's range."""
    seq_q, seq_k, heads_q, heads_kv, head_dim, is_causal, window, tokens = case
    mask_arguments = token_arguments(tokens, seq_q, seq_k) if tokens else {}
    keys = jax.random.split(jax.random.key(1), 3)
    q, k, v = (jax.random.normal(key, (2, seq, heads, head_dim)) * 100.0 for key, seq, heads in
               zip(keys, (seq_q, seq_k, seq_k), (heads_q, heads_kv, heads_kv)))
    out = jax.jit(lambda q, k, v: jax_flash.dot_product_attention_fp8(
        q, k, v, query_scale=0.01, key_scale=0.01, value_scale=0.01, is_causal=is_causal, local_window_size=window,
        **mask_arguments))(*(x.astype(jnp.float8_e4m3fn) for x in (q, k, v)))
    finite = bool(np.all(np.isfinite(np.asarray(out, np.float32))))
    print("fp8", case, "ok" if finite else "NOT FINITE", flush=True)
    return finite


def decode_reads_only_valid_entries(case, dtype) -> bool:
    """A cache of random rows below each sequence's length and sentinel rows from there on (a zero key, values of
    60000): update_kv_cache writes each sequence's last q_len rows, then decode_attention reads the cache. True if
    every output is finite and within the range of the values the sequence may read."""
    capacity, heads_q, heads_kv, head_dim, q_len, page_size, window, softcap = case
    rng = np.random.default_rng(capacity)
    lengths = np.array([0, capacity, q_len - 1 if q_len > 1 else 1, capacity // 3 + q_len], np.int32)
    batch = len(lengths)
    # Rows start at length - q_len, traced so that update_kv_cache drops the ones before 0 instead of raising; the
    # second sequence's fill the cache up to its capacity.
    positions = jnp.asarray(lengths - q_len)
    new_k, new_v = (np.asarray(jnp.asarray(rng.standard_normal((batch, q_len, heads_kv, head_dim)), dtype), np.float32)
                    for _ in range(2))
    valid = (np.arange(capacity)[None, :] < (lengths - q_len)[:, None])[:, :, None, None]
    shape = (batch, capacity, heads_kv, head_dim)
    dense_k = np.where(valid, rng.standard_normal(shape), 0.0)
    dense_v = np.where(valid, rng.standard_normal(shape), 60000.0)
    k_cache, v_cache = jnp.asarray(dense_k, dtype), jnp.asarray(dense_v, dtype)
    table = None
    if page_size is not None:
        (k_cache, v_cache), table = paged_copy(rng, (k_cache, v_cache), page_size)

    @jax.jit
    def step(k_cache, v_cache, query, positions):
        k_cache, v_cache = jax_flash.update_kv_cache(k_cache, v_cache, jnp.asarray(new_k, dtype),
                                                     jnp.asarray(new_v, dtype), positions, page_table=table)
        return jax_flash.decode_attention(query, k_cache, v_cache, jnp.asarray(lengths), local_window_size=window,
                                          softcap=softcap, page_table=table)

    query = jnp.asarray(rng.standard_normal((batch, q_len, heads_q, head_dim)), dtype)
    out = np.asarray(step(k_cache, v_cache, query, positions), np.float32)
    # Every value a sequence may read is one of the random rows or the new ones: all far below the sentinel.
    bound = 1.01 * max(np.max(np.abs(np.asarray(jnp.asarray(dense_v, dtype), np.float32)[dense_v < 60000.0])),
                       np.max(np.abs(new_v)))
    ok = bool(np.all(np.isfinite(out)) and np.max(np.abs(out)) <= bound)
    print("decode", case, jnp.dtype(dtype).name, "ok" if ok else "NOT FINITE OR OUT OF RANGE", flush=True)
    return ok


if __name__ == "__main__":
    sys.exit(main())
