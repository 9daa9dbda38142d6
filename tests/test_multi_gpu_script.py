"""examples/multi_gpu.py at its CPU preset on 2 fake devices, at tiny sizes: every sharded result equals the
single-device one and no compiled program gathers q/k/v. Only the checks are asserted; fake devices share the
machine's cores, so the script's timings are not.

The script runs in a fresh process because the fake devices must be requested before JAX starts, and from tmp_path so
that the installed jax_flash (with its compiled extension) is imported, not the source folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "multi_gpu.py"


def test_cpu_preset_on_two_fake_devices(tmp_path):
    # Appended: conftest.py may already have put an optimisation level in XLA_FLAGS, which keeps compiling quick.
    xla_flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags.strip())
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--preset", "cpu", "--seq", "64", "--ring-seqs", "64,128", "--min-seconds", "0",
         "--json", "multi_gpu.json"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-5000:]
    result = json.loads((tmp_path / "multi_gpu.json").read_text())
    assert result["devices"] == 2 and result["platform"] == "cpu" and result["passed"]
    assert [r["sharding"] for r in result["sharded"]] == ["batch", "heads"]
    assert [r["seq"] for r in result["ring"]] == [64, 128]
    for row in result["sharded"] + result["ring"]:
        assert row["devices"] == 2
        assert max(row["errors"].values()) <= result["tolerance"], row
        assert row["program"]["all-gather"] == 0 and row["program"]["jax_flash_kernels"] > 0, row
    assert all(r["program"]["collective-permute"] > 0 for r in result["ring"])
    assert "| batch | 2 |" in done.stdout and "| 128 | 2 |" in done.stdout
