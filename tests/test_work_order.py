"""The persistent Hopper forward's work order (csrc/cuda/hopper/work_tiles.cuh): every work tile handed out once,
groups of (head, batch) pairs whole and in order, query tiles heaviest first under a causal mask, and the group size
a divisor within the L2 budget. tests/cuda/work_order.cu checks it on the host; it needs nvcc, not a GPU."""

from __future__ import annotations

import subprocess

import pytest

from host_cuda import build, nvcc


def test_work_order_hands_out_every_tile_once_in_whole_groups(tmp_path):
    compiler = nvcc()
    if compiler is None:
        pytest.skip("needs nvcc")
    result = subprocess.run([str(build(compiler, "work_order.cu", tmp_path / "work_order"))], capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().splitlines()[-1] == "120 orders checked, 0 failures", result.stdout
