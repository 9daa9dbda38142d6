"""A/B of the decode kernel's K/V copies: harness binaries whose copies differ in one way each, timed alternately.

    python tests/cuda/decode_copy_variants.py build DIR [VARIANT ...]   # on any machine with nvcc (no GPU needed)
    python tests/cuda/decode_copy_variants.py run DIR [--rounds N]      # on the GPU: every binary in DIR, alternated

`build` copies csrc/ and tests/ into a scratch folder per variant, rewrites the one thing the variant changes (the
`cp.async` hints in csrc/cuda/tensor_core/ptx.cuh, or how many lanes share a key row in decode_split_rows.cuh), and
builds tests/cuda/decode_harness.cu from it as DIR/decode_harness_<variant> ("main" is the tree unchanged). A
rewrite that no longer finds its text fails the build rather than timing an unchanged copy. `run` times each
binary's production plan (`--profile`) on the issue-6 shapes, all variants once per round, and prints GB/s per round
and each variant's ratio to main's; differences inside the rounds' spread are noise.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[2]
PTX = "csrc/cuda/tensor_core/ptx.cuh"
ROWS = "csrc/cuda/decode_split_rows.cuh"
FETCH_128 = ".L2::cache_hint.L2::128B ["
LANES_8 = "constexpr int kLanesPerRow = 8, "

# variant -> [(file, text, replacement)]
VARIANTS = {
    "main": [],
    # L2 fetches the whole 256-byte key row at the first request instead of its 128-byte line.
    "fetch256": [(PTX, FETCH_128, ".L2::cache_hint.L2::256B [")],
    # No fetch size: L2 fetches only the sectors asked for.
    "no_fetch": [(PTX, FETCH_128, ".L2::cache_hint [")],
    # The copies pass through L1 (.ca) instead of going to L2 only (.cg), so L1 asks L2 for whole lines.
    "through_l1": [(PTX, "cp.async.cg.shared.global" + FETCH_128, "cp.async.ca.shared.global" + FETCH_128)],
    # 16 lanes share a 128-wide row, so one copy instruction asks for whole 256-byte rows (both lines of 2 rows)
    # instead of the same line of 4 rows.
    "row16": [(ROWS, LANES_8, "constexpr int kLanesPerRow = kWidth >= 128 ? 16 : 8, ")],
}
VARIANTS["row16_fetch256"] = VARIANTS["row16"] + VARIANTS["fetch256"]

SHAPES = ["8x4k", "8x32k", "1x131k", "64x8k", "128x2k"]


def build(out: pathlib.Path, names: list[str]) -> None:
    out = out.resolve()  # nvcc runs in the scratch tree
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        with tempfile.TemporaryDirectory() as scratch:
            tree = pathlib.Path(scratch)
            for folder in ("csrc", "tests"):
                shutil.copytree(REPO / folder, tree / folder)
            for path, text, replacement in VARIANTS[name]:
                source = (tree / path).read_text()
                if text not in source:
                    sys.exit(f"{name}: {path} no longer contains {text!r}")
                (tree / path).write_text(source.replace(text, replacement))
            binary = out / f"decode_harness_{name}"
            subprocess.run(["nvcc", "-std=c++17", "-O3", "-arch=sm_90a", "--expt-relaxed-constexpr", "-I", "csrc",
                            "tests/cuda/decode_harness.cu", "csrc/cuda/decode_split.cu",
                            "csrc/cuda/decode_kv_update.cu", "-o", str(binary)], cwd=tree, check=True)
            print(f"built {binary}")


def run(out: pathlib.Path, rounds: int) -> None:
    binaries = sorted(out.glob("decode_harness_*"), key=lambda b: b.name != "decode_harness_main")
    rates: dict[tuple[str, str], list[float]] = {}
    for round_ in range(rounds):
        for binary in binaries:
            for shape in SHAPES:
                line = subprocess.run([str(binary), "--profile", shape], capture_output=True, text=True).stdout
                found = re.search(r"([\d.]+) GB/s( WRONG)?", line)
                if not found or found.group(2):
                    sys.exit(f"{binary.name} {shape}: {line.strip() or 'no output'}")
                rates.setdefault((binary.name, shape), []).append(float(found.group(1)))
                print(f"round {round_ + 1} {binary.name} {line.strip()}", flush=True)
    print("\nGB/s per round (ratio of the rounds' sum to main's):")
    print(f"{'variant':<30}" + "".join(f"{shape:>24}" for shape in SHAPES))
    for binary in binaries:
        cells = []
        for shape in SHAPES:
            mine, main = rates[(binary.name, shape)], rates.get(("decode_harness_main", shape))
            ratio = f" ({sum(mine) / sum(main):.3f})" if main else ""
            cells.append(" / ".join(f"{r:.0f}" for r in mine) + ratio)
        print(f"{binary.name.removeprefix('decode_harness_'):<30}" + "".join(f"{cell:>24}" for cell in cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["build", "run"])
    parser.add_argument("dir", type=pathlib.Path)
    parser.add_argument("variants", nargs="*", help=f"build only these, of {', '.join(VARIANTS)} (default: all)")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    unknown = set(args.variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    if args.command == "build":
        build(args.dir, args.variants or list(VARIANTS))
    else:
        run(args.dir, args.rounds)


if __name__ == "__main__":
    main()
