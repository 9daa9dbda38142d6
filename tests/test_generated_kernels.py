"""The instantiation files of both kernel families are exactly what their generators' tables produce (no hand edits,
none stale), and CMake's lists come from the same tables."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

CUDA = pathlib.Path(__file__).resolve().parents[1] / "csrc" / "cuda"
GENERATORS = {family: CUDA / family / "generate_instantiations.py" for family in ("tensor_core", "hopper")}


@pytest.mark.parametrize("family", list(GENERATORS))
def test_generated_files_match_the_generator(family):
    generator = GENERATORS[family]
    result = subprocess.run([sys.executable, str(generator), "--check"], capture_output=True, text=True)
    assert result.returncode == 0, f"run {generator} to refresh csrc/cuda/{family}/generated:\n{result.stderr}"


def test_every_head_dim_bucket_is_listed_for_cmake():
    result = subprocess.run([sys.executable, str(GENERATORS["tensor_core"]), "--list"], capture_output=True,
                            text=True, check=True)
    assert result.stdout.strip() == "32;64;96;128;192;256"


def test_hopper_files_listed_for_cmake_exist():
    """CMake compiles the files --list names (filtered by dtype and head dim); each must exist in generated/."""
    result = subprocess.run([sys.executable, str(GENERATORS["hopper"]), "--list"], capture_output=True, text=True,
                            check=True)
    names = result.stdout.strip().split(";")
    assert {"forward_bf16_hdim128.cu", "backward_fp16_hdim64.cu"} <= set(names)
    for name in names:
        assert (CUDA / "hopper" / "generated" / name).is_file(), name
