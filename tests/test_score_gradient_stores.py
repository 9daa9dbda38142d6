"""The fused Hopper backward derives three of each thread's four dS^T store addresses, and the second buffer's, from
one (backward_kernel.cuh). tests/cuda/score_gradient_stores.cu checks that derivation against CuTe's swizzled
addresses for every consumer thread; it needs nvcc and the CUTLASS headers, not a GPU."""

from __future__ import annotations

import os
import pathlib
import subprocess

import pytest

from host_cuda import build, nvcc


def _cutlass_include() -> pathlib.Path | None:
    if os.environ.get("CUTLASS_INCLUDE_DIR"):
        return pathlib.Path(os.environ["CUTLASS_INCLUDE_DIR"])
    try:
        import cutlass_library
    except ImportError:
        return None
    return pathlib.Path(cutlass_library.__file__).parent / "source" / "include"


def test_every_thread_stores_where_the_kernel_derives(tmp_path):
    compiler, cutlass = nvcc(), _cutlass_include()
    if compiler is None or cutlass is None or not (cutlass / "cute" / "tensor.hpp").exists():
        pytest.skip("needs nvcc and the CUTLASS headers (pip install nvidia-cutlass)")
    program = build(compiler, "score_gradient_stores.cu", tmp_path / "score_gradient_stores",
                    "--expt-relaxed-constexpr", "-isystem", str(cutlass))
    result = subprocess.run([str(program)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    summaries = [line.split(" mismatches")[0] for line in result.stdout.splitlines() if " mismatches over " in line]
    assert summaries == ["bfloat16: 0", "float16: 0"], result.stdout
