"""The kernels of GPUs whose blocks may use at most 99 KB of shared memory (sm86, sm89), checked on any GPU.

There the tensor-core kernels take their small tile table in the head-dim buckets whose default tiles need more (the
backward from head dim 97 on, the forward from 129 to 192), and decode its plans for such GPUs. JAX_FLASH_KERNELS=sm86
holds every GPU to that budget; the kernels read it once per process, so the cases run in a subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest

import test_decode
import test_segments
from test_segments import Case

# Every small-table kernel: dense and token-mask variants, both dtypes, Sq != Sk, GQA, window and soft cap; 300 keys
# span many of the 32-key blocks, and head dim 160 runs zero-padded in the 192 bucket.
ATTENTION_CASES = [
    Case(300, 300, "bfloat16", heads=(4, 2), segments=False, is_causal=True, head_dim=128),
    Case(300, 300, "float16", heads=(4, 1), positions=True, lengths="both", is_causal=True, head_dim=128),
    Case(150, 330, "bfloat16", heads=(2, 2), segments=False, window=(30, 10), softcap=20.0, head_dim=160),
    Case(300, 300, "float16", heads=(4, 2), lengths="both", is_causal=True, head_dim=192),
    Case(330, 150, "bfloat16", heads=(2, 1), segments=False, lengths="q", is_causal=True, head_dim=256),
    Case(300, 300, "bfloat16", heads=(4, 2), positions=True, window=(40, 0), softcap=5.0, head_dim=256),
]
# (batch, max_len, q_len, heads_q, heads_kv, head_dim, dtype, extra), as test_decode.CASES: long caches that split.
DECODE_CASES = [
    (2, 3000, 1, 8, 2, 128, "bfloat16", {}),
    (2, 2100, 4, 16, 4, 256, "float16", {"softcap": 10.0}),
]
IN_SUBPROCESS = os.environ.get("JAX_FLASH_KERNELS") == "sm86"


@pytest.mark.skipif(not IN_SUBPROCESS, reason="run by test_small_tiles_on_this_gpu under JAX_FLASH_KERNELS=sm86")
@pytest.mark.parametrize("case", [pytest.param(c, id=c.id()) for c in ATTENTION_CASES])
def test_attention_case(case, gpu_platform, rng):
    test_segments.check_case(case, gpu_platform, rng)


@pytest.mark.skipif(not IN_SUBPROCESS, reason="run by test_small_tiles_on_this_gpu under JAX_FLASH_KERNELS=sm86")
@pytest.mark.parametrize("batch,max_len,q_len,heads_q,heads_kv,head_dim,dtype,extra", DECODE_CASES)
def test_decode_case(gpu_platform, rng, batch, max_len, q_len, heads_q, heads_kv, head_dim, dtype, extra):
    test_decode.check_random_case(gpu_platform, rng, batch, max_len, q_len, heads_q, heads_kv, head_dim, dtype, extra)


def test_small_tiles_on_this_gpu(gpu_platform):
    # Memory on demand: this process holds the GPU too.
    env = dict(os.environ, JAX_FLASH_KERNELS="sm86", XLA_PYTHON_CLIENT_PREALLOCATE="false")
    env.pop("PYTEST_XDIST_WORKER", None)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", __file__, "-p", "no:cacheprovider", "-q", "-rfE",
         "-k", "attention_case or decode_case"],
        env=env, capture_output=True, text=True, cwd=tempfile.gettempdir())
    cases = len(ATTENTION_CASES) + len(DECODE_CASES)
    assert result.returncode == 0 and f"{cases} passed" in result.stdout, result.stdout[-6000:] + result.stderr[-2000:]
