"""Side-by-side benchmark of jax_flash against jax.nn.dot_product_attention in the same process, on the same inputs.

    jax-flash                                # the demo grid on the default device (= python -m jax_flash)
    jax-flash --grid cpu-acceptance --json out.json --plot out.png
    python -m jax_flash.benchmark --memory   # peak host memory of a long forward, each implementation in a subprocess

Every jax_flash result is checked against the float32 reference before it is timed. FLOPs: forward 4*B*H*Sq*Sk*D
(halved when causal); forward+backward 3.5x the forward. The FP8 rows (full and features grids) time
jax_flash.dot_product_attention_fp8 on e4m3 inputs, forward only, and the peers on the same values in bfloat16.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

import jax_flash


class Case(NamedTuple):
    batch: int
    seq: int
    heads: int
    head_dim: int
    causal: bool
    dtype: str
    heads_kv: int | None = None  # None: as many as query heads
    window: tuple[int, int] | None = None  # local_window_size
    softcap: float | None = None
    deterministic: bool = False  # jax_flash's backward: bitwise-stable (two kernels) or the default (fused dQ sum)

    def visible_pairs(self) -> float:
        """(query, key) pairs the mask lets through, per batch and head: what FLOP/s are counted on. Causal counts
        S^2 / 2 like the published numbers; windows are counted exactly."""
        if self.window is None:
            return self.seq**2 / (2 if self.causal else 1)
        rows = np.arange(self.seq)
        left, right = self.window
        last = np.minimum(self.seq - 1, rows + (0 if self.causal else right))
        return float(np.sum(last - np.maximum(0, rows - left) + 1))


def _grid(name: str, on_gpu: bool) -> list[Case]:
    if name == "demo":
        dtype = "bfloat16" if on_gpu else "float32"
        seqs = (1024, 4096) if on_gpu else (512, 2048)
        return [Case(max(1, 8192 // s) if on_gpu else 1, s, 8, d, c, dtype)
                for s in seqs for d in (64, 128) for c in (False, True)]
    if name == "cpu-acceptance":
        return [Case(1, 4096, 8, 64, c, "float32") for c in (False, True)]
    anchors = [Case(16384 // s, s, 2048 // d, d, c, "bfloat16")  # shared/anchors.md: B*S = 16384, H*D = 2048
               for d in (64, 128, 256) for s in (1024, 4096, 16384) for c in (False, True)]
    if name == "anchors":
        return anchors
    if name == "quick":  # one cell per head dim and mask, for a fast look while developing
        return [c for c in anchors if c.seq == 4096]
    # GQA 32/8, fp16, FP8 (forward only), and the cost of a window or a softcap against the plain mask at the same
    # visible work.
    extras = ([Case(16384 // s, s, 32, 128, c, "bfloat16", heads_kv=8) for s in (4096, 16384) for c in (False, True)]
              + [Case(4, 4096, 16, 128, c, "float16") for c in (False, True)]
              + [Case(1, 16384, 16, 128, c, FP8) for c in (False, True)]
              + [Case(1, 16384, 16, 128, True, "bfloat16", window=(4096, 0)),
                 Case(1, 16384, 16, 128, False, "bfloat16", softcap=30.0),
                 Case(1, 16384, 16, 128, True, "bfloat16", softcap=30.0)])
    if name == "full":
        return anchors + extras
    if name == "features":
        return extras
    raise ValueError(f"unknown grid {name!r}")


FP8 = "float8_e4m3fn"
# _check's gates on the max abs error against the float32 reference: a bfloat16 output keeps 8 significant bits, so
# rounding alone moves one near 2 by 8e-3. FP8 calls on the Hopper kernel round the probabilities to e4m3 (3
# mantissa bits): a causal row that sees a few keys moves by up to 2^-4 of its values' spread; a numpy model of the
# kernel gave 3.3e-2 at S = 4096 causal (3.6e-3 full), hence a gate of 0.1.
TOLERANCE = {"float32": 1e-4, "bfloat16": 3e-2, "float16": 4e-3, FP8: 1e-1}


def _random_inputs(case: Case):
    """q, k, v of the case, standard normal. FP8 cases draw bfloat16 and round it to e4m3 (its range holds them,
    so every per-tensor scale is 1); the peers, which take no FP8, get the same values as bfloat16 (_peer_inputs)."""
    # The same data whichever backward is timed.
    keys = jax.random.split(jax.random.key(hash(case._replace(deterministic=False)) % 2**31), 3)
    kv_shape = (case.batch, case.seq, case.heads_kv or case.heads, case.head_dim)
    draw_dtype = jnp.bfloat16 if case.dtype == FP8 else case.dtype
    q = jax.random.normal(keys[0], (case.batch, case.seq, case.heads, case.head_dim), draw_dtype)
    k, v = (jax.random.normal(key, kv_shape, draw_dtype) for key in keys[1:])
    return tuple(x.astype(case.dtype) for x in (q, k, v))


def _peer_inputs(case: Case, q, k, v):
    """What the peers run on: the case's inputs, or for an FP8 case their bfloat16 values (made once per case,
    untimed); jax_flash runs on the case's inputs."""
    return (q, k, v) if case.dtype != FP8 else tuple(x.astype(jnp.bfloat16) for x in (q, k, v))


def _fa3():
    """flash-attn3-jax's flash_mha when it is installed (it runs on Hopper GPUs only), else None."""
    try:
        from flash_attn3_jax import flash_mha
    except ImportError:
        return None
    return flash_mha


def _peers(on_gpu: bool) -> list[str]:
    return ["jax_flash", "xla"] + (["cudnn"] + (["fa3_jax"] if _fa3() else []) if on_gpu else [])


def _attention(impl: str, case: Case):
    """impl's attention on this case's mask, or None when impl has no such option (jax.nn has no softcap)."""
    causal, window = case.causal, case.window
    if impl == "jax_flash" and case.dtype == FP8:
        return lambda q, k, v: jax_flash.dot_product_attention_fp8(
            q, k, v, query_scale=1.0, key_scale=1.0, value_scale=1.0, is_causal=causal, local_window_size=window,
            softcap=case.softcap)
    if impl == "jax_flash":
        return lambda q, k, v: jax_flash.dot_product_attention(q, k, v, is_causal=causal, local_window_size=window,
                                                               deterministic=case.deterministic,
                                                               softcap=case.softcap)
    if case.softcap is not None:
        return None
    if impl == "fa3_jax":
        sides = (-1, 0 if causal else -1) if window is None else (window[0], 0 if causal else window[1])
        return lambda q, k, v: _fa3()(q, k, v, is_causal=causal, window_size=sides)
    return lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal, local_window_size=window,
                                                        implementation=impl)


def _fwd_bwd(attend):
    def loss(q, k, v):
        return jnp.sum(attend(q, k, v).astype(jnp.float32))

    return jax.grad(loss, argnums=(0, 1, 2))


def _time(fn, args, min_seconds: float) -> float:
    """Median seconds per call over 3 repeats of back-to-back calls, after a warm-up call."""
    jax.block_until_ready(fn(*args))
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    calls = max(1, int(min_seconds / max(time.perf_counter() - start, 1e-6)))
    samples = []
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(calls):
            out = fn(*args)
        jax.block_until_ready(out)
        samples.append((time.perf_counter() - start) / calls)
    return float(np.median(samples))


def _check(case: Case, q, k, v) -> float:
    """Max abs error of jax_flash's forward against the float32 reference; raises if it is not close.

    The reference materialises the S x S logits, so it runs on the first batch row and the query heads of the first
    kv head only (at S = 16k and 32 heads the whole problem would need over 60 GB); jax_flash runs the whole case and
    is compared on that slice."""
    group = case.heads // (case.heads_kv or case.heads)
    ours = jax.jit(_attention("jax_flash", case))(q, k, v)[:1, :, :group].astype(jnp.float32)
    q1, k1, v1 = (x[:1, :, :heads].astype(jnp.float32) for x, heads in ((q, group), (k, 1), (v, 1)))
    # "highest": on a GPU, XLA's default float32 matmuls use TF32, which alone misses the float32 tolerance.
    with jax.default_matmul_precision("highest"):
        ref = jax_flash.dot_product_attention(q1, k1, v1, is_causal=case.causal, local_window_size=case.window,
                                              softcap=case.softcap, implementation="xla")
    err = float(jnp.max(jnp.abs(ours - ref)))
    tolerance = TOLERANCE[case.dtype]
    if not err <= tolerance:
        raise AssertionError(f"jax_flash disagrees with the reference on {case}: max abs error {err}")
    return err


def run(grid: str, parts: tuple[str, ...], min_seconds: float, only: tuple[str, ...] = (),
        seqs: tuple[int, ...] = (), deterministic: bool = False, on_case=None,
        head_dims: tuple[int, ...] = (), masks: tuple[str, ...] = ()) -> list[dict]:
    """Every measurement of the grid; `on_case(rows)`, if given, sees the rows so far after each case, so a run cut
    short by a time limit still leaves what it measured."""
    on_gpu = jax.default_backend() == "gpu"
    cases = [c._replace(deterministic=deterministic) for c in _grid(grid, on_gpu)
             if (not seqs or c.seq in seqs) and (not head_dims or c.head_dim in head_dims)
             and (not masks or ("causal" if c.causal else "full") in masks)]
    impls = [i for i in _peers(on_gpu) if not only or i in only or i == "jax_flash"]
    rows = []
    for case in tqdm(cases, desc="benchmark", unit="case"):
        q, k, v = _random_inputs(case)
        err = _check(case, q, k, v)
        peer_inputs = _peer_inputs(case, q, k, v)
        flops_fwd = 4 * case.batch * case.heads * case.visible_pairs() * case.head_dim
        for part in parts:
            if part == "fwd+bwd" and case.dtype == FP8:
                continue  # FP8 attention is for inference: forward only
            flops = flops_fwd * (3.5 if part == "fwd+bwd" else 1)
            for impl in impls:
                fn = _attention(impl, case)
                try:
                    if fn is None:
                        raise NotImplementedError(f"{impl} has no option for this case")
                    fn = jax.jit(fn if part == "fwd" else _fwd_bwd(fn))
                    seconds = _time(fn, (q, k, v) if impl == "jax_flash" else peer_inputs, min_seconds)
                except Exception as e:  # a peer that cannot run this case is reported, not fatal
                    tqdm.write(f"{impl} failed on {case} {part}: {type(e).__name__}: {str(e)[:200]}")
                    seconds = float("nan")
                rows.append(dict(case._asdict(), part=part, impl=impl, ms=seconds * 1e3,
                                 tflops=flops / seconds / 1e12, max_abs_err=err if impl == "jax_flash" else None))
        if on_case:
            on_case(rows)
    return rows


def format_table(rows: list[dict]) -> str:
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    peers = [i for i in impls if i != "jax_flash"]
    header = ["B", "S", "H", "D", "mask", "dtype", "part"] + [f"{i} ms" for i in impls] + [
        f"{i} TFLOP/s" for i in impls] + [f"speedup vs {p}" for p in peers]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["batch"], r["seq"], r["heads"], r["heads_kv"], r["head_dim"], _mask_label(r), r["dtype"],
                           r["part"]), {})[r["impl"]] = r
    for (b, s, h, h_kv, d, mask, dtype, part), by_impl in groups.items():
        cells = [str(b), str(s), f"{h}/{h_kv}" if h_kv else str(h), str(d), mask, dtype, part]
        cells += [f"{by_impl[i]['ms']:.2f}" for i in impls]
        cells += [f"{by_impl[i]['tflops']:.3f}" for i in impls]
        cells += [f"{by_impl[p]['ms'] / by_impl['jax_flash']['ms']:.2f}" for p in peers]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _mask_label(row: dict) -> str:
    label = "causal" if row["causal"] else "full"
    if row.get("window"):
        label += f" win{tuple(row['window'])}"
    if row.get("softcap"):
        label += f" cap{row['softcap']:g}"
    return label


def _plot_label(row: dict) -> str:
    heads = f" H{row['heads']}/{row['heads_kv']}" if row["heads_kv"] else ""
    return f"S{row['seq']} D{row['head_dim']}{heads} {_mask_label(row)} {row['dtype'][:4]}"


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = list(dict.fromkeys(r["part"] for r in rows))
    fig, axes = plt.subplots(1, len(parts), figsize=(7 * len(parts), 4), squeeze=False)
    for ax, part in zip(axes[0], parts):
        sub = [r for r in rows if r["part"] == part]
        labels = list(dict.fromkeys(_plot_label(r) for r in sub))
        impls = list(dict.fromkeys(r["impl"] for r in sub))
        width = 0.8 / len(impls)
        for n, impl in enumerate(impls):
            by_label = {_plot_label(r): r["tflops"] for r in sub if r["impl"] == impl}
            values = [by_label.get(label, float("nan")) for label in labels]
            ax.bar(np.arange(len(labels)) + n * width, values, width, label=impl)
        ax.set_xticks(np.arange(len(labels)) + 0.4 - width / 2, labels, rotation=45, ha="right")
        ax.set_ylabel("TFLOP/s")
        ax.set_title(f"{part} on {jax.devices()[0].device_kind}")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _peak_memory_child(impl: str, seq: int) -> None:
    """Runs one forward at [1, seq, 1, 64] float32 and prints the process's peak resident memory in MiB."""
    import resource

    q, k, v = (jax.random.normal(key, (1, seq, 1, 64), jnp.float32) for key in jax.random.split(jax.random.key(0), 3))
    fn = jax.jit(_attention(impl, Case(1, seq, 1, 64, False, "float32")))
    start = time.perf_counter()
    jax.block_until_ready(fn(q, k, v))
    seconds = time.perf_counter() - start
    print(json.dumps(dict(impl=impl, seq=seq, seconds=seconds,
                          peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)))


def memory_table(seq: int) -> str:
    lines = ["| impl | S | first call incl. compile (s) | peak RSS (MiB) |", "|---|---|---|---|"]
    for impl in ("jax_flash", "xla"):
        # Run from the temp dir: `-m` puts the working directory first on sys.path, and a source checkout there
        # would shadow the installed, compiled package.
        child = subprocess.run([sys.executable, "-m", "jax_flash.benchmark", "--memory-child", impl, str(seq)],
                               capture_output=True, text=True, cwd=tempfile.gettempdir())
        if child.returncode != 0:
            lines.append(f"| {impl} | {seq} | failed: {child.stderr.strip().splitlines()[-1][:120]} | |")
            continue
        r = json.loads(child.stdout.strip().splitlines()[-1])
        lines.append(f"| {impl} | {seq} | {r['seconds']:.2f} | {r['peak_rss_mib']:.0f} |")
    return "\n".join(lines)


def comma_ints(text: str) -> tuple[int, ...]:
    """An argparse type: "1024,4096" -> (1024, 4096)."""
    return tuple(int(x) for x in text.split(","))


def comma_masks(text: str) -> tuple[str, ...]:
    """An argparse type: "full,causal" -> ("full", "causal"); a misspelt mask would select no case, so it is refused."""
    masks = tuple(text.split(","))
    unknown = set(masks) - {"full", "causal"}
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown mask {sorted(unknown)}; allowed: full, causal")
    return masks


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grid", default="demo", choices=("demo", "cpu-acceptance", "anchors", "quick", "features", "full"))
    parser.add_argument("--impls", help="comma-separated subset of the peers to run (default: all available)")
    parser.add_argument("--seqs", type=comma_ints, default=(),
                        help="comma-separated sequence lengths to keep from the grid (default: all)")
    parser.add_argument("--head-dims", type=comma_ints, default=(),
                        help="comma-separated head dims to keep from the grid (default: all)")
    parser.add_argument("--masks", type=comma_masks, default=(),
                        help="comma-separated subset of full,causal: the cases to keep by is_causal (default: both)")
    parser.add_argument("--parts", default="fwd,fwd+bwd", help="comma-separated subset of fwd,fwd+bwd")
    parser.add_argument("--min-seconds", type=float, default=0.2, help="time per repeat, at least one call")
    parser.add_argument("--deterministic", action="store_true",
                        help="time jax_flash's bitwise-stable backward instead of the default")
    parser.add_argument("--json", help="write every measurement to this JSON file")
    parser.add_argument("--plot", help="write a TFLOP/s bar chart to this PNG (needs matplotlib)")
    parser.add_argument("--memory", type=int, nargs="?", const=32768, metavar="SEQ",
                        help="peak host memory of a forward at [1, SEQ, 1, 64] float32, per implementation")
    parser.add_argument("--memory-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_child:
        _peak_memory_child(args.memory_child[0], int(args.memory_child[1]))
        return
    if args.memory:
        print(memory_table(args.memory))
        return
    print(f"jax_flash {jax_flash.__version__} on {jax.devices()[0].device_kind}, jax {jax.__version__}")

    printed = 0

    def save(rows: list[dict]) -> None:  # the new table lines, and every row so far to the JSON file
        nonlocal printed
        lines = format_table(rows).splitlines()[2:]
        for line in lines[printed:]:
            tqdm.write(line)
        printed = len(lines)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dict(device=jax.devices()[0].device_kind, jax=jax.__version__, rows=rows), f, indent=1)

    rows = run(args.grid, tuple(args.parts.split(",")), args.min_seconds,
               tuple(args.impls.split(",")) if args.impls else (),
               args.seqs, args.deterministic, on_case=save, head_dims=args.head_dims,
               masks=args.masks)
    save(rows)  # a grid that selected no case still leaves its (empty) JSON file
    print(format_table(rows))
    if args.plot:
        plot(rows, args.plot)


if __name__ == "__main__":
    main()
