"""examples/train_lm.py end to end on the CPU at a tiny size: it trains (loss goes down) and writes its checkpoint,
metrics and loss-curve PNG; --compare prints a step-time row per implementation and skips cuDNN without a GPU."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

for _module in ("flax", "optax", "matplotlib"):
    pytest.importorskip(_module, reason="examples/train_lm.py needs flax, optax and matplotlib "
                                        "(pip install 'jax_flash[examples]')")

TRAIN_LM = pathlib.Path(__file__).resolve().parents[1] / "examples" / "train_lm.py"
TINY = ["--seq-len", "32", "--batch-size", "8", "--features", "32", "--num-layers", "1", "--num-heads", "2",
        "--learning-rate", "1e-2", "--eval-every", "10", "--eval-batches", "2"]


def run_example(tmp_path, *args) -> str:
    # From tmp_path, so the installed jax_flash (with its compiled extension) is imported, not the source folder.
    result = subprocess.run([sys.executable, str(TRAIN_LM), *TINY, *args], cwd=tmp_path, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_training_lowers_the_loss_and_writes_its_outputs(tmp_path):
    stdout = run_example(tmp_path, "--steps", "30", "--out-dir", "out")
    out = tmp_path / "out"
    metrics = json.loads((out / "metrics.json").read_text())
    first_train_loss = metrics["train_losses"][0][1]
    assert [step for step, _ in metrics["eval_losses"]] == [10, 20, 30]
    assert metrics["eval_losses"][-1][1] < first_train_loss - 1.0  # from ~ln(256) = 5.5 nats to well below
    assert "mean step time (jax_flash):" in stdout
    checkpoint = np.load(out / "checkpoint.npz")
    assert int(checkpoint["step"]) == 30
    assert checkpoint["params/embed/embedding"].shape == (256, 32)
    assert json.loads(str(checkpoint["config"]))["features"] == 32
    assert (out / "loss_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_times_each_available_implementation(tmp_path):
    stdout = run_example(tmp_path, "--compare", "--compare-steps", "4")
    assert "| jax_flash |" in stdout and "| xla |" in stdout and "| cudnn |" in stdout
    if jax.default_backend() == "cpu":
        assert "| cudnn | skipped: cuDNN attention needs a GPU" in stdout
