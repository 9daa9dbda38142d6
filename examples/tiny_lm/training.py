"""Training and evaluation of the decoder LM: optimizer, jitted steps, the loop with its progress bar and timings."""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm import tqdm

from tiny_lm.attention import attention_fn
from tiny_lm.data import VOCAB_SIZE, random_batch
from tiny_lm.model import DecoderLM

# The first steps compile (and on a GPU autotune); they are left out of the mean step time.
TIMING_WARMUP_STEPS = 2


@dataclasses.dataclass(frozen=True)
class Config:
    seq_len: int
    batch_size: int
    features: int
    num_layers: int
    num_heads: int
    dtype: str
    learning_rate: float
    warmup_steps: int
    steps: int
    eval_every: int
    eval_batches: int
    seed: int


@dataclasses.dataclass
class History:
    """What a run measured; train/eval losses as (step, loss) pairs, step times in seconds."""

    implementation: str
    train_losses: list = dataclasses.field(default_factory=list)
    eval_losses: list = dataclasses.field(default_factory=list)
    step_seconds: list = dataclasses.field(default_factory=list)
    params: dict | None = None

    def mean_step_seconds(self) -> float:
        timed = self.step_seconds[TIMING_WARMUP_STEPS:] or self.step_seconds
        return float(np.mean(timed))


def _loss(model, params, batch):
    logits = model.apply({"params": params}, batch[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()


def _optimizer(config: Config, total_steps: int):
    # Short runs (--compare, tests) warm up over their first quarter at most, so they still reach the full rate.
    warmup = min(config.warmup_steps, total_steps // 4)
    schedule = optax.warmup_cosine_decay_schedule(0.0, config.learning_rate, warmup, max(total_steps, warmup + 1),
                                                  end_value=config.learning_rate / 10)
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, b2=0.99, weight_decay=0.01))


def train(config: Config, implementation: str, train_tokens: np.ndarray, eval_tokens: np.ndarray | None,
          steps: int) -> History:
    """`steps` optimizer steps with `implementation`'s attention; evaluates every config.eval_every steps and at the
    end when eval_tokens are given. The same seed gives every implementation the same params and batches."""
    model = DecoderLM(VOCAB_SIZE, config.seq_len, config.features, config.num_layers, config.num_heads,
                      attention_fn(implementation), dtype=jnp.dtype(config.dtype))
    optimizer = _optimizer(config, steps)
    params = model.init(jax.random.key(config.seed), jnp.zeros((1, config.seq_len), jnp.int32))["params"]
    opt_state = optimizer.init(params)

    @jax.jit
    def train_step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(lambda p: _loss(model, p, batch))(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    eval_loss = jax.jit(lambda params, batch: _loss(model, params, batch))
    data_rng = np.random.default_rng(config.seed)
    eval_set = None
    if eval_tokens is not None:  # fixed batches, so successive evaluations compare like with like
        eval_rng = np.random.default_rng(config.seed + 1)
        eval_set = [random_batch(eval_tokens, config.batch_size, config.seq_len, eval_rng)
                    for _ in range(config.eval_batches)]

    history = History(implementation)
    progress = tqdm(range(1, steps + 1), desc=implementation, unit="step", dynamic_ncols=True)
    for step in progress:
        batch = random_batch(train_tokens, config.batch_size, config.seq_len, data_rng)
        start = time.perf_counter()
        params, opt_state, loss = train_step(params, opt_state, batch)
        loss = float(loss)  # waits for the step, so the time below is the step's own
        history.step_seconds.append(time.perf_counter() - start)
        history.train_losses.append((step, loss))
        if eval_set is not None and (step % config.eval_every == 0 or step == steps):
            mean_eval = float(np.mean([eval_loss(params, batch) for batch in eval_set]))
            history.eval_losses.append((step, mean_eval))
            progress.write(f"step {step:5d}  train loss {loss:.3f}  eval loss {mean_eval:.3f}")
        progress.set_postfix(loss=f"{loss:.3f}")
    history.params = params
    return history
