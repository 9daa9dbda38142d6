"""The sm80 tensor-core backward's fused dQ (tensor_core/query_gradient_sum.cuh), checked on any GPU.

Calls that do not ask for determinism, at head dims up to 128 and without a token mask, sum dQ inside the dk/dv
kernel with atomics on GPUs that run the sm80 kernels. JAX_FLASH_KERNELS=sm80 keeps a Hopper GPU on them too; the
kernels read it once per process, so the cases run in a subprocess. Each case is checked against the reference under
the suite's tolerance rule, and against deterministic=True: out, dk and dv to the bit, dq one rounding apart.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import jax
import numpy as np
import pytest

import attention_testing as at
import jax_flash

# (seq_q, seq_k, heads_q, heads_kv, head_dim, dtype, options): every head-dim bucket that fuses (80 runs in 96),
# partial key and query blocks, GQA, causal, window and soft cap.
CASES = [
    (300, 300, 4, 2, 64, "bfloat16", dict(is_causal=True)),
    (150, 333, 2, 1, 32, "float16", dict(local_window_size=(30, 10))),
    (257, 190, 6, 2, 80, "bfloat16", dict(softcap=20.0)),
    (300, 300, 4, 1, 128, "float16", dict(is_causal=True, softcap=5.0)),
    (129, 500, 2, 2, 128, "bfloat16", {}),
]
IN_SUBPROCESS = os.environ.get("JAX_FLASH_KERNELS") == "sm80"


def case_id(case) -> str:
    seq_q, seq_k, heads_q, heads_kv, head_dim, dtype, options = case
    return f"q{seq_q}k{seq_k}-h{heads_q}/{heads_kv}-d{head_dim}-{dtype}-" + ("-".join(sorted(options)) or "full")


@pytest.mark.skipif(not IN_SUBPROCESS, reason="run by test_fused_query_gradient_on_this_gpu under JAX_FLASH_KERNELS=sm80")
@pytest.mark.parametrize("case", [pytest.param(c, id=case_id(c)) for c in CASES])
def test_sm80_case(case, gpu_platform, rng):
    seq_q, seq_k, heads_q, heads_kv, head_dim, dtype, options = case
    q, k, v = at.random_qkv(rng, gpu_platform, seq_q=seq_q, seq_k=seq_k, heads_q=heads_q, heads_kv=heads_kv,
                            head_dim=head_dim, dtype=at.DTYPES[dtype])
    cotangent = at.normal(rng, q.shape, at.DTYPES[dtype], gpu_platform)
    fused = at.check_fwd_and_vjp(q, k, v, cotangent, gpu_platform, **options)

    def run(q, k, v, cotangent):
        out, vjp = jax.vjp(lambda *a: jax_flash.dot_product_attention(*a, deterministic=True, **options), q, k, v)
        return (out, *vjp(cotangent))

    reference = jax.jit(run)(q, k, v, cotangent)
    fused = (fused[0], *fused[1])
    for name, a, b in zip(("out", "dq", "dk", "dv"), fused, reference):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        if name == "dq":
            np.testing.assert_allclose(a, b, rtol=0, atol=2 * at.eps(at.DTYPES[dtype]) * np.max(np.abs(b)))
        else:
            np.testing.assert_array_equal(a, b, err_msg=name)


def test_fused_query_gradient_on_this_gpu(gpu_platform):
    # Memory on demand: this process holds the GPU too.
    env = dict(os.environ, JAX_FLASH_KERNELS="sm80", XLA_PYTHON_CLIENT_PREALLOCATE="false")
    env.pop("PYTEST_XDIST_WORKER", None)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", __file__, "-p", "no:cacheprovider", "-q", "-rfE", "-k", "sm80_case"],
        env=env, capture_output=True, text=True, cwd=tempfile.gettempdir())
    assert result.returncode == 0 and f"{len(CASES)} passed" in result.stdout, (
        result.stdout[-6000:] + result.stderr[-2000:])
