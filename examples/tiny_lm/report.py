"""What a run leaves behind: the checkpoint, the metrics, the loss-curve PNG and the step-time table."""

from __future__ import annotations

import dataclasses
import json
import pathlib

import jax
import numpy as np

from tiny_lm.training import Config, History


def save_checkpoint(path: pathlib.Path, history: History, config: Config) -> None:
    """The trained params as a plain .npz (one array per parameter, keyed by its path in the params tree), with the
    step count and the config, so the checkpoint opens with numpy alone."""
    arrays = {"/".join(str(getattr(k, "key", k)) for k in key_path): np.asarray(leaf)
              for key_path, leaf in jax.tree_util.tree_leaves_with_path(history.params)}
    np.savez(path, **{f"params/{name}": value for name, value in arrays.items()},
             step=np.int64(len(history.train_losses)), config=np.array(json.dumps(dataclasses.asdict(config))))


def save_metrics(path: pathlib.Path, history: History, config: Config, corpus: str) -> None:
    path.write_text(json.dumps({
        "implementation": history.implementation, "corpus": corpus, "config": dataclasses.asdict(config),
        "mean_step_ms": 1e3 * history.mean_step_seconds(), "train_losses": history.train_losses,
        "eval_losses": history.eval_losses}, indent=1))


def plot_losses(path: pathlib.Path, history: History, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    steps, losses = np.array(history.train_losses).T
    figure, axes = plt.subplots(figsize=(7, 4.2))
    axes.plot(steps, losses, color="tab:blue", alpha=0.3, linewidth=0.8, label="train (per step)")
    window = max(1, len(losses) // 25)  # a moving average shows the trend through the per-batch noise
    if window > 1:
        smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
        axes.plot(steps[window - 1:], smooth, color="tab:blue", label=f"train ({window}-step mean)")
    if history.eval_losses:
        eval_steps, eval_losses = np.array(history.eval_losses).T
        axes.plot(eval_steps, eval_losses, "o-", color="tab:orange", label="eval (held-out text)")
    axes.set(xlabel="step", ylabel="cross-entropy (nats per byte)", title=title)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def step_time_table(rows: list[tuple[str, History | str]], config: Config) -> str:
    """A Markdown table: per implementation its mean step time, throughput and last loss, or why it was skipped."""
    tokens_per_step = config.batch_size * config.seq_len
    timed = {name: h.mean_step_seconds() for name, h in rows if isinstance(h, History)}
    lines = ["| attention | mean step ms | tokens/s | loss at last step | jax_flash speedup |", "|---|---|---|---|---|"]
    for name, result in rows:
        if isinstance(result, str):
            lines.append(f"| {name} | skipped: {result} | | | |")
            continue
        seconds = timed[name]
        speedup = f"{seconds / timed['jax_flash']:.2f}" if "jax_flash" in timed else ""
        lines.append(f"| {name} | {1e3 * seconds:.1f} | {tokens_per_step / seconds:,.0f} | "
                     f"{result.train_losses[-1][1]:.3f} | {speedup} |")
    return "\n".join(lines)
