"""jax_flash on all visible devices: batch/head sharding under jit, and causal ring attention over the sequence.

    # two real GPUs (after installing jax_flash with its CUDA kernels; run from outside the source tree):
    python examples/multi_gpu.py --preset h200 --json multi_gpu.json
    # fake CPU devices: checks the numbers and the compiled programs, its timings mean nothing
    XLA_FLAGS=--xla_force_host_platform_device_count=2 python examples/multi_gpu.py --preset cpu

(a) Forward+backward of dot_product_attention under jax.jit on NamedSharding inputs, the batch split over the devices
    and then the heads: the results must equal the single-device call on the same global inputs, and the compiled
    program must hold no all-gather (each device runs the kernel on its own slice). Timed against one device running
    the per-device slice alone: with no communication, each device should keep the single-device throughput.
(b) Causal ring_attention in jax.shard_map, the sequence split over the devices in the zig-zag layout, forward+backward
    at each --ring-seqs length: the results must equal the one-device kernel on the whole sequence (its memory is
    linear in S: it fits wherever the whole q/k/v do on one device), and the step time against it gives the speedup.

Prints two markdown tables, writes every number to --json, and exits with 1 if a case raised or an equality or HLO
check failed.
FLOPs are counted like jax_flash.benchmark: causal forward 2*B*H*S^2*D, forward+backward 3.5x that.
"""

from __future__ import annotations

import os

# NVLink multicast (NVLS) in NCCL can put a shared host's GPUs out of service, so it stays off whatever the caller's
# environment says. NCCL and NVSHMEM read these when XLA creates its communicators, hence before jax is imported.
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import argparse  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jax_flash  # noqa: E402

PRESETS = {
    # Small enough for 8 fake devices sharing 2 cores.
    "cpu": dict(dtype="float32", batch=1, seq=256, heads=2, head_dim=32, ring_batch=1, ring_heads=2,
                ring_seqs="512,2048", min_seconds=0.05),
    # Per-GPU slices that keep an H200 busy for milliseconds (launch overhead negligible); the ring lengths of issue 9.
    "h200": dict(dtype="bfloat16", batch=4, seq=4096, heads=16, head_dim=128, ring_batch=1, ring_heads=16,
                 ring_seqs="32768,131072", min_seconds=0.2),
}
# Largest |sharded - single| relative to the largest |single|, per output. Batch/head sharding runs the same kernel
# on each slice; the ring rounds each block's output to the input dtype before its float32 merge (one rounding).
TOLERANCE = {"float32": 5e-6, "float16": 2e-3, "bfloat16": 1e-2}
OUTPUTS = ("out", "dq", "dk", "dv")
COLLECTIVES = ("all-gather", "all-reduce", "all-to-all", "reduce-scatter", "collective-permute")


def _forward_and_backward(attention):
    """(q, k, v, cotangent) -> (out, dq, dk, dv): one training step's attention work in one program."""

    def step(q, k, v, cotangent):
        out, vjp = jax.vjp(attention, q, k, v)
        return (out, *vjp(cotangent))

    return jax.jit(step)


def _inputs(seed, batch, seq, heads, head_dim, dtype, device):
    """q, k, v and the output cotangent, made on `device` (host-made arrays at S=128k would take seconds)."""
    keys = jax.random.split(jax.random.key(seed), 4)
    with jax.default_device(device):
        return [jax.random.normal(key, (batch, seq, heads, head_dim), dtype) for key in keys]


def _seconds_per_call(fn, args, min_seconds):
    """Median over 3 repeats of back-to-back calls lasting about min_seconds, after one call that compiles."""
    jax.block_until_ready(fn(*args))
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    calls = max(1, round(min_seconds / (time.perf_counter() - start)))
    repeats = []
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(calls):
            result = fn(*args)
        jax.block_until_ready(result)
        repeats.append((time.perf_counter() - start) / calls)
    return float(np.median(repeats))


@jax.jit
def _relative_error(got, want):
    got, want = got.astype(jnp.float32), want.astype(jnp.float32)
    return jnp.max(jnp.abs(got - want)) / jnp.max(jnp.abs(want))


def _errors(got, want, device, order=None):
    """Relative error of each sharded output against the single-device one, computed on `device`; `order` is the
    token order of the sharded sequence when it is not the natural one."""
    errors = {}
    for name, g, w in zip(OUTPUTS, got, want):
        if order is not None:
            w = jnp.take(w, order, axis=1)
        errors[name] = float(_relative_error(jax.device_put(g, device), w))
    return errors


def _program_contents(compiled) -> dict:
    """How many of each collective the compiled program runs (async ones counted by their -start), and how many
    jax_flash kernel calls: a program without them would pass the collective checks by not running the kernels."""
    hlo = compiled.as_text()
    return {name: len(re.findall(rf"\s{name}(?:-start)?\(", hlo)) for name in COLLECTIVES} | {
        "jax_flash_kernels": hlo.count("jax_flash_attention_")}


def _tflops(batch, seq, heads, head_dim, seconds):
    return 3.5 * 2 * batch * heads * seq**2 * head_dim / seconds / 1e12


def sharded_jit(args, mesh, device) -> list[dict]:
    """(a): batch-sharded and head-sharded steps, each against one device on the global and the per-device problem."""
    step = _forward_and_backward(functools.partial(jax_flash.dot_product_attention, is_causal=True))
    local = (args.batch, args.seq, args.heads, args.head_dim)
    local_seconds = _seconds_per_call(step, _inputs(0, *local, args.dtype, device), args.min_seconds)

    def case(name, spec, scaled_axis):
        n = mesh.size
        shape = list(local)
        shape[scaled_axis] *= n
        inputs = _inputs(1, *shape, args.dtype, device)
        sharded = [jax.device_put(x, NamedSharding(mesh, spec)) for x in inputs]
        errors = _errors(step(*sharded), step(*inputs), device)
        seconds = _seconds_per_call(step, sharded, args.min_seconds)
        program = _program_contents(step.lower(*sharded).compile())
        return dict(
            shape=shape, errors=errors, program=program, equal=max(errors.values()) <= TOLERANCE[args.dtype],
            hlo_ok=program["all-gather"] == 0 and program["jax_flash_kernels"] > 0,
            one_device_ms=local_seconds * 1e3, sharded_ms=seconds * 1e3,
            one_device_tflops=_tflops(*local, local_seconds), per_device_tflops=_tflops(*shape, seconds) / n,
            per_device_ratio=local_seconds / seconds)

    return [_guarded(dict(sharding=name, devices=mesh.size, dtype=args.dtype), case, name, spec, axis)
            for name, spec, axis in (("batch", P("x"), 0), ("heads", P(None, None, "x"), 2))]


def ring(args, mesh, device) -> list[dict]:
    """(b): causal ring attention over the 'x' axis against the one-device kernel on the whole sequence."""
    n = mesh.size
    spec = P(None, "x")
    attention = jax.shard_map(functools.partial(jax_flash.ring_attention, axis_name="x", is_causal=True),
                              mesh=mesh, in_specs=spec, out_specs=spec)
    ring_step = _forward_and_backward(attention)
    one_device_step = _forward_and_backward(functools.partial(jax_flash.dot_product_attention, is_causal=True))

    def case(seq):
        shape = (args.ring_batch, seq, args.ring_heads, args.head_dim)
        inputs = _inputs(seq, *shape, args.dtype, device)
        order = jax_flash.zigzag_permutation(seq, n)
        sharded = [jax.device_put(jnp.take(x, order, axis=1), NamedSharding(mesh, spec)) for x in inputs]
        errors = _errors(ring_step(*sharded), one_device_step(*inputs), device, jax.device_put(order, device))
        one_device_seconds = _seconds_per_call(one_device_step, inputs, args.min_seconds)
        ring_seconds = _seconds_per_call(ring_step, sharded, args.min_seconds)
        program = _program_contents(ring_step.lower(*sharded).compile())
        return dict(
            shape=list(shape), errors=errors, program=program, equal=max(errors.values()) <= TOLERANCE[args.dtype],
            hlo_ok=(program["all-gather"] == 0 and program["jax_flash_kernels"] > 0
                    and (n == 1 or program["collective-permute"] > 0)),
            one_device_ms=one_device_seconds * 1e3, ring_ms=ring_seconds * 1e3,
            ring_tflops=_tflops(*shape, ring_seconds), speedup=one_device_seconds / ring_seconds)

    return [_guarded(dict(seq=seq, devices=n, dtype=args.dtype), case, seq) for seq in args.ring_seqs]


def _guarded(row: dict, case, *case_args) -> dict:
    """The row with case's results, or with the error it raised: a size that fails (out of memory, say) must not
    cost the other rows of a run on machines that are rarely lent. Reports each row as it ends, for the same reason."""
    try:
        row |= case(*case_args)
    except Exception as e:  # noqa: BLE001  (recorded in the row and failing the run's checks)
        row["error"] = f"{type(e).__name__}: {str(e)[:2000]}"
    print(json.dumps(row), file=sys.stderr, flush=True)
    return row


def _check(passed: bool) -> str:
    return "yes" if passed else "**NO**"


def _failed(first_cells: str, row: dict) -> str:
    return f"| {first_cells} | {row['dtype']} | failed: {row['error'].splitlines()[0][:200]} |"


def tables(sharded_rows, ring_rows) -> str:
    lines = ["| sharding | devices | global B, S, H, D | dtype | max rel. error | equal | all-gathers "
             "| collectives in the program | 1 device, per-device size (ms) | sharded (ms) "
             "| TFLOP/s per device: 1 device / sharded | per-device ratio |", "|" + "---|" * 12]
    for r in sharded_rows:
        if "error" in r:
            lines.append(_failed(f"{r['sharding']} | {r['devices']} | ", r))
            continue
        collectives = ", ".join(f"{k} {v}" for k, v in r["program"].items() if v and k in COLLECTIVES) or "none"
        lines.append(
            f"| {r['sharding']} | {r['devices']} | {', '.join(map(str, r['shape']))} | {r['dtype']} "
            f"| {max(r['errors'].values()):.1e} | {_check(r['equal'])} | {r['program']['all-gather']} "
            f"| {collectives} | {r['one_device_ms']:.2f} | {r['sharded_ms']:.2f} "
            f"| {r['one_device_tflops']:.3g} / {r['per_device_tflops']:.3g} | {r['per_device_ratio']:.3f} |")
    lines += ["", "| ring, causal: S | devices | B, H, D | dtype | max rel. error | equal | all-gathers "
              "| collective-permutes | 1 device (ms) | ring (ms) | ring TFLOP/s | speedup |", "|" + "---|" * 12]
    for r in ring_rows:
        if "error" in r:
            lines.append(_failed(f"{r['seq']} | {r['devices']} | ", r))
            continue
        batch, _, heads, head_dim = r["shape"]
        lines.append(
            f"| {r['seq']} | {r['devices']} | {batch}, {heads}, {head_dim} | {r['dtype']} "
            f"| {max(r['errors'].values()):.1e} | {_check(r['equal'])} | {r['program']['all-gather']} "
            f"| {r['program']['collective-permute']} | {r['one_device_ms']:.2f} | {r['ring_ms']:.2f} "
            f"| {r['ring_tflops']:.3g} | {r['speedup']:.2f} |")
    return "\n".join(lines)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=tuple(PRESETS), required=True)
    parser.add_argument("--dtype", choices=tuple(TOLERANCE))
    parser.add_argument("--batch", type=int, help="(a) batch per device")
    parser.add_argument("--seq", type=int, help="(a) sequence length")
    parser.add_argument("--heads", type=int, help="(a) heads per device")
    parser.add_argument("--head-dim", type=int)
    parser.add_argument("--ring-batch", type=int)
    parser.add_argument("--ring-heads", type=int)
    parser.add_argument("--ring-seqs", help="(b) comma-separated total sequence lengths, multiples of 2 * devices")
    parser.add_argument("--min-seconds", type=float, help="length of each timed repeat (at least one call)")
    parser.add_argument("--json", default="multi_gpu.json", help="where to write every number")
    args = parser.parse_args(argv)
    for name, value in PRESETS[args.preset].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.ring_seqs = [int(s) for s in args.ring_seqs.split(",")]
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    devices = jax.devices()
    mesh = jax.make_mesh((len(devices),), ("x",), axis_types=(AxisType.Auto,), devices=devices)
    platform = devices[0].platform
    print(f"jax_flash {jax_flash.__version__}, jax {jax.__version__}: {len(devices)} x {devices[0].device_kind} "
          f"({platform}), preset {args.preset}")
    if platform == "cpu":
        print("fake CPU devices share this machine's cores: the equality and HLO checks hold, the timings mean nothing")
    sharded_rows = sharded_jit(args, mesh, devices[0])
    ring_rows = ring(args, mesh, devices[0])
    print(tables(sharded_rows, ring_rows))
    passed = all("error" not in r and r["equal"] and r["hlo_ok"] for r in sharded_rows + ring_rows)
    print("checks (every case ran, equal to one device, no all-gather, the kernels in the program, ring passes):",
          "passed" if passed else "FAILED")
    with open(args.json, "w") as f:
        json.dump(dict(preset=args.preset, platform=platform, device_kind=devices[0].device_kind,
                       devices=len(devices), jax=jax.__version__, jax_flash=jax_flash.__version__,
                       tolerance=TOLERANCE[args.dtype], passed=passed, sharded=sharded_rows, ring=ring_rows),
                  f, indent=1)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
