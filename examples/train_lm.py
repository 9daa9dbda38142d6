"""Train a small byte-level decoder-only language model with Flax + optax, attention by jax_flash or jax.nn.

    python examples/train_lm.py                          # CPU default: trains in a few minutes
    python examples/train_lm.py --attention xla          # the same model on jax.nn.dot_product_attention (XLA)
    python examples/train_lm.py --preset gpu --compare   # step time of each implementation on a GPU

A normal run prints progress and periodic eval loss, then the mean step time, and writes checkpoint.npz,
metrics.json and loss_curve.png to --out-dir. --compare instead trains each available implementation (jax_flash,
xla, cudnn) for --compare-steps steps from the same start and prints a step-time table.
Needs flax, optax and matplotlib: pip install 'jax_flash[examples]'.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys

import jax

from tiny_lm import data, report
from tiny_lm.attention import IMPLEMENTATIONS, unavailable_reason
from tiny_lm.training import TIMING_WARMUP_STEPS, Config, train

PRESETS = {
    # ~0.65 M params: under 4 minutes on a 2-core CPU.
    "cpu": Config(seq_len=128, batch_size=16, features=128, num_layers=3, num_heads=4, dtype="float32",
                  learning_rate=3e-3, warmup_steps=50, steps=600, eval_every=100, eval_batches=8, seed=0),
    # ~19 M params, 16k tokens a step, bfloat16 (cuDNN's attention needs 16-bit inputs).
    "gpu": Config(seq_len=1024, batch_size=16, features=512, num_layers=6, num_heads=8, dtype="bfloat16",
                  learning_rate=1e-3, warmup_steps=100, steps=1000, eval_every=100, eval_batches=8, seed=0),
}
_FIELD_TYPES = {"int": int, "float": float, "str": str}


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--attention", choices=IMPLEMENTATIONS, default="jax_flash")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu",
                        help="model and run size; the flags below override single fields")
    for field in dataclasses.fields(Config):
        # Config's annotations are strings (postponed evaluation): "int", "float" or "str".
        parser.add_argument(f"--{field.name.replace('_', '-')}", type=_FIELD_TYPES[field.type], default=None)
    parser.add_argument("--corpus", help="a text file to train on (default: the Python docs CPython installs)")
    parser.add_argument("--out-dir", type=pathlib.Path, default=pathlib.Path("train_lm_out"))
    parser.add_argument("--compare", action="store_true",
                        help="time every available attention implementation instead of training one")
    parser.add_argument("--compare-steps", type=int, default=30)
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    config = dataclasses.replace(PRESETS[args.preset], **{
        f.name: getattr(args, f.name) for f in dataclasses.fields(Config) if getattr(args, f.name) is not None})
    tokens, corpus = data.load_corpus(args.corpus)
    train_tokens, eval_tokens = data.split(tokens, eval_fraction=0.1, seq_len=config.seq_len)
    print(f"corpus: {corpus}; device: {jax.devices()[0].device_kind} ({jax.default_backend()})")
    print(f"config: {config}")
    if args.compare:
        compare(config, train_tokens, args.compare_steps)
    else:
        train_one(config, args.attention, train_tokens, eval_tokens, corpus, args.out_dir)


def train_one(config, implementation, train_tokens, eval_tokens, corpus, out_dir: pathlib.Path) -> None:
    reason = unavailable_reason(implementation, config.dtype)
    if reason:
        sys.exit(f"--attention {implementation} cannot run here: {reason}")
    history = train(config, implementation, train_tokens, eval_tokens, config.steps)
    out_dir.mkdir(parents=True, exist_ok=True)
    report.save_checkpoint(out_dir / "checkpoint.npz", history, config)
    report.save_metrics(out_dir / "metrics.json", history, config, corpus)
    report.plot_losses(out_dir / "loss_curve.png", history,
                       f"byte-level LM, {implementation} attention, {jax.devices()[0].device_kind}")
    first, last = history.train_losses[0][1], history.eval_losses[-1][1]
    print(f"train loss at step 1: {first:.3f}; eval loss at step {config.steps}: {last:.3f} "
          f"({last / 0.6931:.2f} bits per byte)")
    print(f"mean step time ({implementation}): {1e3 * history.mean_step_seconds():.1f} ms")
    print(f"wrote {out_dir / 'checkpoint.npz'}, {out_dir / 'metrics.json'}, {out_dir / 'loss_curve.png'}")


def compare(config, train_tokens, steps: int) -> None:
    rows = []
    for implementation in IMPLEMENTATIONS:
        reason = unavailable_reason(implementation, config.dtype)
        if reason:
            print(f"{implementation}: skipped, {reason}")
        rows.append((implementation, reason or train(config, implementation, train_tokens, None, steps)))
    print(f"\nmean step time over steps {TIMING_WARMUP_STEPS + 1}..{steps} "
          f"(batch {config.batch_size} x {config.seq_len} tokens, {config.dtype}):\n")
    print(report.step_time_table(rows, config))


if __name__ == "__main__":
    main()
