"""Building the host-only CUDA checks of tests/cuda (no GPU needed, only nvcc): where nvcc is, and one build call."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

REPO = pathlib.Path(__file__).resolve().parents[1]


def nvcc() -> str | None:
    """nvcc on PATH, else CUDA's default install, else None."""
    found = shutil.which("nvcc")
    if found:
        return found
    default = pathlib.Path("/usr/local/cuda/bin/nvcc")
    return str(default) if default.exists() else None


def build(compiler: str, source: str, program: pathlib.Path, *flags: str) -> pathlib.Path:
    """Compile tests/cuda/<source> against csrc/ into `program` (raises with nvcc's output on failure)."""
    result = subprocess.run([compiler, "-std=c++17", "-I", str(REPO / "csrc"), *flags,
                             str(REPO / "tests" / "cuda" / source), "-o", str(program)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    return program
