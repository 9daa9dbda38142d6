"""Decode benchmark: one new token per sequence against a full KV cache, jax_flash beside its peers.

    python -m jax_flash.bench_decode [--json out.json] [--plot out.png] [--reps N] [--head-dim D] [--cases BxL,...]

GQA 32 query / 8 kv heads, head_dim 128 (or D), bfloat16, at (batch, cache length) = (8, 4k), (8, 32k), (1, 131k),
(64, 8k), (128, 2k) on a GPU, or a small float32 grid on the CPU. Each implementation is timed three ways:

* call: `reps` back-to-back calls of the jitted implementation on the same inputs, one wait at the end, the way
  the peers' decode numbers that the project set out to beat were measured; Python's dispatch of each call overlaps
  the previous call's kernels, so it adds to the time only where a call is shorter than its dispatch.
* loop: `reps` dependent steps (each step's query depends on the previous output, so no step can be skipped) in a
  rolled `lax.fori_loop`, as a generation loop runs; every step also pays the loop's control, which on a GPU can cost
  more than a short decode call. The cache is the same in every step, so XLA may hoist work on it (a relayout of K,
  say) out of the loop, which a generation loop, whose cache changes each step, could not.
* unrolled: the same steps written out one after another in one program, as the layers of one decode step of a
  model are; XLA can capture them into one command buffer (CUDA graph) where every custom call among them allows it.

Reported per timing: microseconds per call and the GB/s of K+V read (batch x length x kv_heads x head_dim x 2 tensors
x itemsize / time), beside jax.nn.dot_product_attention (cudnn and xla, on a query of length 1) and, when
importable, jax.experimental.pallas.ops.gpu.decode_attention.gqa and flash-attn3-jax's flash_mha, and jax_flash's
ratio to the fastest peer (the peer's time / jax_flash's), and the host's time until the steps were enqueued (a
timing where that is most of the time is marked host-bound: it measures Python and XLA's dispatch, not the GPU; in
the rolled loop it includes XLA's control of each step, which waits for the GPU). Every result is checked against
jax.nn's xla output first.

Also measured in the same process: jax_flash on a paged copy of the same cache ("jax_flash paged": pages of
PAGE_SIZE positions in a shuffled pool, each sequence's page table a random permutation) and its time over the
contiguous layout's, and the device's copy bandwidth (a jitted elementwise op over a large array, bytes read + written
per second), against which each jax_flash timing's GB/s is reported as a fraction, and the host's dispatch floor: the
call timing of a jitted function that takes the same operands and does next to nothing (q + 1). No implementation's
call can be shorter; where one's call is near it, the call timing compares hosts, not kernels.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import jax
import jax.numpy as jnp
import numpy as np

import jax_flash

HEADS_Q, HEADS_KV, HEAD_DIM = 32, 8, 128
GPU_CASES = [(8, 4096), (8, 32768), (1, 131072), (64, 8192), (128, 2048)]
CPU_CASES = [(1, 4096), (4, 2048), (16, 512)]
PAGE_SIZE = 64
PAGED = "jax_flash paged"  # ours on the paged layout: compared with the contiguous layout, not counted as a peer
COPY_BYTES = {"gpu": 1 << 30, "cpu": 1 << 26}  # array size for the copy-bandwidth measurement


def _implementations(on_gpu: bool):
    """name -> f(q [B, 1, Hq, D], k, v [B, L, Hkv, D], lengths [B]) -> out [B, 1, Hq, D]; PAGED's k and v are
    page pools [pages, PAGE_SIZE, Hkv, D] and it takes the page table [B, L / PAGE_SIZE] after the lengths."""
    impls = {"jax_flash": lambda q, k, v, n: jax_flash.decode_attention(q, k, v, n),
             PAGED: lambda q, k, v, n, table: jax_flash.decode_attention(q, k, v, n, page_table=table)}
    if on_gpu:
        impls["jax.nn cudnn"] = lambda q, k, v, n: jax.nn.dot_product_attention(q, k, v, implementation="cudnn")
    impls["jax.nn xla"] = lambda q, k, v, n: jax.nn.dot_product_attention(q, k, v, implementation="xla")
    if on_gpu:
        try:
            from jax.experimental.pallas.ops.gpu import decode_attention as pallas_decode

            impls["pallas gqa"] = lambda q, k, v, n: pallas_decode.gqa(
                q[:, 0], k, v, sm_scale=1.0 / math.sqrt(q.shape[-1]))[:, None]
        except ImportError:
            pass
        try:
            from flash_attn3_jax import flash_mha  # Hopper only; takes GQA caches as they are

            impls["flash-attn3-jax"] = lambda q, k, v, n: flash_mha(q, k, v)
        except ImportError:
            pass
    return impls


def _program(fn, reps: int, timing: str):
    """A callable running `reps` decode steps of `fn` the way `timing` names (see the module docstring)."""
    if timing == "call":
        once = jax.jit(fn)

        def calls(*args):
            for _ in range(reps):
                out = once(*args)
            return out

        return calls

    @jax.jit
    def steps(q, *cache):
        step = lambda q: q + 1e-3 * fn(q, *cache).astype(q.dtype)  # noqa: E731
        if timing == "loop":
            return jax.lax.fori_loop(0, reps, lambda _, q: step(q), q)
        for _ in range(reps):
            q = step(q)
        return q

    return steps


# Largest |difference| from jax.nn's xla output (at full float32 precision) accepted per dtype; the outputs are
# averages of unit normal values. float32 as for float16: a peer's float32 product on a GPU is TF32 by default (10
# mantissa bits, like float16), 5.7e-4 off on the H200.
TOLERANCE = {"bfloat16": 3e-2, "float16": 4e-3, "float32": 4e-3}
TIMINGS = ("call", "loop", "unrolled")
GPU_REPS = dict(call=50, loop=50, unrolled=20)  # steps per timed program
HOST_BOUND = 0.9  # a timing whose enqueueing took this share of it is marked host-bound


def _time(fn, args, reps: int, timing: str, repeats: int = 5) -> tuple[float, float]:
    """Seconds per step, and the host's seconds per step to enqueue them: the best of `repeats` timings of the
    reps-step program. Where the second is near the first, the host, not the GPU, sets the pace."""
    run = _program(fn, reps, timing)
    run(*args).block_until_ready()  # compile and warm up
    best = (math.inf, math.inf)
    for _ in range(repeats):
        start = time.perf_counter()
        out = run(*args)
        enqueued = time.perf_counter()
        out.block_until_ready()
        best = min(best, ((time.perf_counter() - start) / reps, (enqueued - start) / reps))
    return best


def measure_copy_bandwidth(nbytes: int, reps: int = 20) -> float:
    """GB/s of a jitted elementwise op over an array of `nbytes` (bytes read + bytes written), timed as the
    decode calls are; the roofline that issue 6 measures decode against."""
    x = jax.device_put(jnp.ones((nbytes // 4,), jnp.float32), jax.devices()[0])
    seconds, _ = _time(lambda x: x + 1.0, (x,), reps, "call")
    return 2 * nbytes / seconds / 1e9


def _paged(k, v, rng):
    """The same caches as page pools in a shuffled order (the last page zero-padded), and the page table that reads
    them back."""
    batch, length = k.shape[:2]
    pages_per_seq = -(-length // PAGE_SIZE)
    slot = rng.permutation(batch * pages_per_seq)  # pool slot of each sequence's pages, in order
    table = jnp.asarray(slot.reshape(batch, pages_per_seq), jnp.int32)

    def to_pool(cache):
        padded = jnp.pad(cache, ((0, 0), (0, pages_per_seq * PAGE_SIZE - length), (0, 0), (0, 0)))
        pages = padded.reshape(batch * pages_per_seq, PAGE_SIZE, *cache.shape[2:])
        return pages[np.argsort(slot)]  # pool[slot[i]] = pages[i]

    return to_pool(k), to_pool(v), table


def run_case(batch: int, length: int, dtype, impls, reps: dict, rng, head_dim: int = HEAD_DIM,
             copy_gb_per_s: float | None = None) -> list[dict]:
    """One cache shape, every implementation; `reps` maps each timing to its number of steps. An implementation that
    fails or answers wrong gets an `error` and no timing. PAGED needs `length` in whole pages."""
    device = jax.devices()[0]
    make = lambda *shape: jax.device_put(jnp.asarray(rng.standard_normal(shape), dtype), device)  # noqa: E731
    q = make(batch, 1, HEADS_Q, head_dim)
    k, v = make(batch, length, HEADS_KV, head_dim), make(batch, length, HEADS_KV, head_dim)
    n = jax.device_put(jnp.full((batch,), length, jnp.int32), device)
    inputs = {name: (q, k, v, n) for name in impls}
    if PAGED in impls:
        key_pages, value_pages, table = jax.device_put(_paged(k, v, rng), device)
        inputs[PAGED] = (q, key_pages, value_pages, n, table)
    kv_bytes = 2 * batch * length * HEADS_KV * head_dim * jnp.dtype(dtype).itemsize
    with jax.default_matmul_precision("highest"):  # a GPU's default float32 product is TF32
        expected = np.asarray(jax.jit(impls["jax.nn xla"])(q, k, v, n), np.float32)
    records = []
    for name, fn in impls.items():
        record = dict(batch=batch, length=length, heads_q=HEADS_Q, heads_kv=HEADS_KV, head_dim=head_dim,
                      dtype=jnp.dtype(dtype).name, implementation=name)
        try:
            err = float(np.max(np.abs(np.asarray(jax.jit(fn)(*inputs[name]), np.float32) - expected)))
            record["max_abs_diff_vs_xla"] = err
            if not err <= TOLERANCE[jnp.dtype(dtype).name]:
                raise ValueError(f"wrong answer: max |diff| vs xla {err:.2e}")
            for timing in TIMINGS:
                seconds, host_seconds = _time(fn, inputs[name], reps[timing], timing)
                record[f"us_{timing}"] = seconds * 1e6
                record[f"us_{timing}_host"] = host_seconds * 1e6
                record[f"gb_per_s_{timing}"] = kv_bytes / seconds / 1e9
        except Exception as error:  # a peer that cannot run this case is reported, not fatal
            record.update(error=f"{type(error).__name__}: {str(error).splitlines()[0][:200]}")
        records.append(record)
        shown = record.get("error") or "  ".join(
            [f"{timing} {record[f'us_{timing}']:8.1f} us {record[f'gb_per_s_{timing}']:7.1f} GB/s"
             + (" (host-bound)" if record[f"us_{timing}_host"] > HOST_BOUND * record[f"us_{timing}"] else "")
             for timing in TIMINGS] + [f"(max |diff| vs xla {record['max_abs_diff_vs_xla']:.2e})"])
        print(f"D={head_dim:3d} B={batch:4d} L={length:7d}  {name:15s} {shown}", flush=True)
    floor, _ = _time(lambda q, k, v, n: q + 1, (q, k, v, n), reps["call"], "call")
    for record in records:
        if "error" not in record:
            record["us_call_dispatch_floor"] = floor * 1e6
    print(f"{'':32s}host dispatch floor (a jitted q + 1 on the same operands): call {floor * 1e6:.1f} us", flush=True)
    _compare_to_peers(records, copy_gb_per_s)
    return records


def _compare_to_peers(records: list[dict], copy_gb_per_s: float | None = None) -> None:
    """Adds to jax_flash's record, per timing, the fastest peer and its time / jax_flash's time, the paged layout's
    time / the contiguous one's (where PAGED ran) and the share of the device's copy bandwidth (where measured), and
    prints them."""
    ours = next((r for r in records if r["implementation"] == "jax_flash"), None)
    if ours is None or "error" in ours:
        return
    paged = next((r for r in records if r["implementation"] == PAGED and "error" not in r), None)
    shown = []
    for timing in TIMINGS:
        if copy_gb_per_s:
            ours[f"fraction_of_copy_{timing}"] = ours[f"gb_per_s_{timing}"] / copy_gb_per_s
        if paged is not None:
            ours[f"paged_over_contiguous_{timing}"] = paged[f"us_{timing}"] / ours[f"us_{timing}"]
        timed = [r for r in records if not r["implementation"].startswith("jax_flash") and f"us_{timing}" in r]
        if not timed:
            continue
        best = min(timed, key=lambda r: r[f"us_{timing}"])
        ours[f"best_peer_{timing}"] = best["implementation"]
        ours[f"ratio_to_best_peer_{timing}"] = best[f"us_{timing}"] / ours[f"us_{timing}"]
        shown.append(f"{timing} {ours[f'ratio_to_best_peer_{timing}']:.2f}x ({best['implementation']})")
    if shown:
        print(f"{'':32s}jax_flash vs the fastest peer: {'  '.join(shown)}", flush=True)
    per_timing = lambda key: "  ".join(f"{t} {ours[f'{key}_{t}']:.3f}" for t in TIMINGS)  # noqa: E731
    if paged is not None:
        print(f"{'':32s}jax_flash paged / contiguous time: {per_timing('paged_over_contiguous')}", flush=True)
    if copy_gb_per_s:
        print(f"{'':32s}jax_flash share of the copy bandwidth: {per_timing('fraction_of_copy')}", flush=True)


def plot(records: list[dict], path: str) -> None:
    """GB/s of K+V read per case and implementation, one panel per timing (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    label = lambda r: f"B{r['batch']} L{r['length']} D{r['head_dim']}"  # noqa: E731
    labels = list(dict.fromkeys(label(r) for r in records))
    impls = list(dict.fromkeys(r["implementation"] for r in records))
    fig, axes = plt.subplots(1, len(TIMINGS), figsize=(7 * len(TIMINGS), 4), squeeze=False)
    width = 0.8 / len(impls)
    for ax, timing in zip(axes[0], TIMINGS):
        for n, impl in enumerate(impls):
            by_label = {label(r): r.get(f"gb_per_s_{timing}", np.nan) for r in records if r["implementation"] == impl}
            ax.bar(np.arange(len(labels)) + n * width, [by_label.get(case, np.nan) for case in labels], width,
                   label=impl)
        ax.set_xticks(np.arange(len(labels)) + 0.4 - width / 2, labels, rotation=30, ha="right")
        ax.set_ylabel("GB/s of K+V read")
        ax.set_title(f"decode, {timing}, on {jax.devices()[0].device_kind}")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _cases(text: str) -> list[tuple[int, int]]:
    """'8x4096,1x131072' -> [(8, 4096), (1, 131072)]."""
    try:
        cases = [tuple(int(n) for n in case.split("x")) for case in text.split(",")]
    except ValueError:
        cases = []
    if not cases or any(len(case) != 2 or min(case) < 1 for case in cases):
        raise argparse.ArgumentTypeError(f"expected batch x length pairs such as 8x4096,1x131072, got {text!r}")
    return cases


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the records to this file")
    parser.add_argument("--plot", help="write a GB/s bar chart to this PNG (needs matplotlib)")
    parser.add_argument("--reps", type=int, default=None,
                        help=f"steps per timed program (default on a GPU: {GPU_REPS}; 5 on the CPU)")
    parser.add_argument("--head-dim", type=int, default=HEAD_DIM, help=f"head dim of every case (default {HEAD_DIM})")
    parser.add_argument("--cases", type=_cases, default=None,
                        help="batch x length pairs, e.g. 8x4096,1x131072 (default: the GPU or CPU grid)")
    args = parser.parse_args(argv)
    on_gpu = jax.devices()[0].platform == "gpu"
    cases, dtype = (GPU_CASES, jnp.bfloat16) if on_gpu else (CPU_CASES, jnp.float32)
    cases = args.cases or cases
    reps = {timing: args.reps or (GPU_REPS[timing] if on_gpu else 5) for timing in TIMINGS}
    print(f"device: {jax.devices()[0].device_kind}; GQA {HEADS_Q}/{HEADS_KV}, head_dim {args.head_dim}, "
          f"{jnp.dtype(dtype).name}, steps per timing {reps}", flush=True)
    copy = measure_copy_bandwidth(COPY_BYTES["gpu" if on_gpu else "cpu"])
    print(f"device copy bandwidth (read + write): {copy:.1f} GB/s", flush=True)
    impls = _implementations(on_gpu)
    rng = np.random.default_rng(0)
    records = [r for batch, length in cases
               for r in run_case(batch, length, dtype, impls, reps, rng, args.head_dim, copy)]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=jax.devices()[0].device_kind, jax=jax.__version__, copy_gb_per_s=copy,
                           records=records), f, indent=1)
    if args.plot:
        plot(records, args.plot)


if __name__ == "__main__":
    main()
