"""The corpus as bytes, split into training and evaluation text, and random windows of it as batches."""

from __future__ import annotations

import pathlib

import numpy as np

VOCAB_SIZE = 256  # byte-level tokens: any text, no tokenizer to ship


def load_corpus(path: str | None) -> tuple[np.ndarray, str]:
    """(tokens as uint8, a description): the file at `path`, or else the Python documentation that CPython installs.

    The default is pydoc_data.topics, the text of the Python Language Reference that `help()` shows (~460 KB of
    English prose with code examples). It comes with every CPython, so the example needs no download and no data
    file in the repository.
    """
    if path is not None:
        data = pathlib.Path(path).read_bytes()
        description = f"{path} ({len(data) / 1e3:.0f} KB)"
    else:
        from pydoc_data.topics import topics

        data = "\n\n".join(topics[name] for name in sorted(topics)).encode("utf-8")
        description = f"pydoc_data.topics, the Python Language Reference ({len(data) / 1e3:.0f} KB)"
    return np.frombuffer(data, dtype=np.uint8), description


def split(tokens: np.ndarray, eval_fraction: float, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """The tail of the corpus is held out for evaluation, so eval loss measures text the model never trained on."""
    cut = int(len(tokens) * (1 - eval_fraction))
    train, evaluation = tokens[:cut], tokens[cut:]
    for name, part in (("training", train), ("evaluation", evaluation)):
        if len(part) <= seq_len + 1:
            raise ValueError(f"the {name} part of the corpus ({len(part)} bytes) is shorter than one sequence "
                             f"({seq_len + 1} bytes): use a larger corpus or a smaller --seq-len")
    return train, evaluation


def random_batch(tokens: np.ndarray, batch_size: int, seq_len: int, rng: np.random.Generator) -> np.ndarray:
    """[batch_size, seq_len + 1] int32 windows at random offsets: inputs are [:, :-1], targets [:, 1:]."""
    starts = rng.integers(0, len(tokens) - seq_len - 1, size=batch_size)
    return np.stack([tokens[s:s + seq_len + 1] for s in starts]).astype(np.int32)
