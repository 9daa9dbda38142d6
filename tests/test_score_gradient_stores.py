"""The fused Hopper backward derives three of each thread's four dS^T store addresses, and the second buffer's, from
one (backward_kernel.cuh). tests/cuda/score_gradient_stores.cu checks that derivation against CuTe's swizzled
addresses for every consumer thread; it needs nvcc and the CUTLASS headers, not a GPU."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


def _nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    default = pathlib.Path("/usr/local/cuda/bin/nvcc")
    return str(default) if default.exists() else None


def _cutlass_include() -> pathlib.Path | None:
    if os.environ.get("CUTLASS_INCLUDE_DIR"):
        return pathlib.Path(os.environ["CUTLASS_INCLUDE_DIR"])
    try:
        import cutlass_library
    except ImportError:
        return None
    return pathlib.Path(cutlass_library.__file__).parent / "source" / "include"


def test_every_thread_stores_where_the_kernel_derives(tmp_path):
    nvcc, cutlass = _nvcc(), _cutlass_include()
    if nvcc is None or cutlass is None or not (cutlass / "cute" / "tensor.hpp").exists():
        pytest.skip("needs nvcc and the CUTLASS headers (pip install nvidia-cutlass)")
    program = tmp_path / "score_gradient_stores"
    subprocess.run([nvcc, "-std=c++17", "--expt-relaxed-constexpr", "-I", str(REPO / "csrc"), "-isystem",
                    str(cutlass), str(REPO / "tests" / "cuda" / "score_gradient_stores.cu"), "-o", str(program)],
                   check=True, capture_output=True, text=True)
    result = subprocess.run([str(program)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    summaries = [line.split(" mismatches")[0] for line in result.stdout.splitlines() if " mismatches over " in line]
    assert summaries == ["bfloat16: 0", "float16: 0"], result.stdout
