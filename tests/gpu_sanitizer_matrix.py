"""A small matrix of attention calls for compute-sanitizer (memcheck, racecheck) on a GPU:

    compute-sanitizer --tool memcheck --error-exitcode 1 python tests/gpu_sanitizer_matrix.py
    compute-sanitizer --tool racecheck --error-exitcode 1 python tests/gpu_sanitizer_matrix.py

Odd lengths (partial tiles at both ends), every head-dim bucket plus padded head dims, causal, windows, softcap,
GQA and Sq != Sk, forward and backward, fp16 and bf16. Exits non-zero if a result is not finite.
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
]


def main() -> int:
    key = jax.random.key(0)
    failures = 0
    for case, dtype in itertools.product(CASES, (jnp.bfloat16, jnp.float16)):
        seq_q, seq_k, heads_q, heads_kv, head_dim, is_causal, window, softcap = case
        keys = jax.random.split(key, 4)
        q = jax.random.normal(keys[0], (2, seq_q, heads_q, head_dim), dtype)
        k = jax.random.normal(keys[1], (2, seq_k, heads_kv, head_dim), dtype)
        v = jax.random.normal(keys[2], (2, seq_k, heads_kv, head_dim), dtype)

        def loss(q, k, v):
            out = jax_flash.dot_product_attention(q, k, v, is_causal=is_causal, local_window_size=window,
                                                  softcap=softcap)
            return jnp.sum(out.astype(jnp.float32) ** 2)

        value, grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(q, k, v)
        finite = np.isfinite(float(value)) and all(np.all(np.isfinite(np.asarray(g, np.float32))) for g in grads)
        print(case, jnp.dtype(dtype).name, "ok" if finite else "NOT FINITE", flush=True)
        failures += not finite
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
