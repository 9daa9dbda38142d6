"""The tensor-core instantiation files are exactly what the generator's tables produce (no hand edits, none stale)."""

from __future__ import annotations

import pathlib
import subprocess
import sys

GENERATOR = pathlib.Path(__file__).resolve().parents[1] / "csrc" / "cuda" / "tensor_core" / "generate_instantiations.py"


def test_generated_files_match_the_generator():
    result = subprocess.run([sys.executable, str(GENERATOR), "--check"], capture_output=True, text=True)
    assert result.returncode == 0, f"run {GENERATOR.name} to refresh csrc/cuda/tensor_core/generated:\n{result.stderr}"


def test_every_head_dim_bucket_is_listed_for_cmake():
    result = subprocess.run([sys.executable, str(GENERATOR), "--list"], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "32;64;96;128;192;256"
