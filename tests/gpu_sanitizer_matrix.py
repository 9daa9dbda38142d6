"""A small matrix of attention calls for compute-sanitizer (memcheck, racecheck) on a GPU:

    compute-sanitizer --tool memcheck --error-exitcode 1 python tests/gpu_sanitizer_matrix.py
    compute-sanitizer --tool racecheck --error-exitcode 1 python tests/gpu_sanitizer_matrix.py

Odd lengths (partial tiles at both ends), every head-dim bucket plus padded head dims, causal, windows, softcap,
GQA and Sq != Sk, forward and backward, fp16 and bf16, then token masks (segment ids, positions, lengths) that
leave tiles empty, partial and full. The last case of each list has more work tiles (144) than an H200 has SMs
(132), so some CTAs of the persistent Hopper forward take two, handing their query buffer over; they are kept small
because racecheck's cost grows with every shared-memory access. Exits non-zero if a result is not finite.
"""

from __future__ import annotations

import itertools
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jax_flash

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
    (256, 256, 36, 6, 64, True, None, None),
]

TOKEN_CASES = [
    # (seq_q, seq_k, heads_q, heads_kv, head_dim, is_causal, window, mask arguments)
    (300, 300, 4, 2, 64, True, None, "segments"),
    (129, 257, 4, 1, 128, False, None, "lengths"),
    (250, 250, 2, 2, 256, True, (40, 0), "segments+positions"),
    (256, 256, 36, 6, 128, True, None, "segments"),
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


def main() -> int:
    key = jax.random.key(0)
    failures = 0
    token_cases = [(*case[:6], case[6], None, case[7]) for case in TOKEN_CASES]
    dense_cases = [(*case, None) for case in CASES]
    for case, dtype in itertools.product(dense_cases + token_cases, (jnp.bfloat16, jnp.float16)):
        seq_q, seq_k, heads_q, heads_kv, head_dim, is_causal, window, softcap, tokens = case
        mask_arguments = token_arguments(tokens, seq_q, seq_k) if tokens else {}
        keys = jax.random.split(key, 4)
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
        failures += not finite
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
