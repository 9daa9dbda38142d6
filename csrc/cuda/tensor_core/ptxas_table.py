#!/usr/bin/env python3
"""Turns ptxas' -v report of a build into the registers/spills table of docs/kernels.md.

    JAX_FLASH_PTXAS_VERBOSE=ON pip install -v --no-build-isolation . > build.log 2>&1
    python csrc/cuda/tensor_core/ptxas_table.py build.log [more logs...]

Several logs (e.g. one per architecture) merge into one table; only the tensor-core kernels are listed.
"""

from __future__ import annotations

import re
import sys

KERNEL = re.compile(r"Compiling entry function '(?P<name>\S+)' for '(?P<arch>\w+)'")
SPILLS = re.compile(r"(\d+) bytes spill stores")
REGISTERS = re.compile(r"Used (\d+) registers")
# Mangled tensor-core kernel names: kernel, element type, head dim, tile table (TileBudget), for dk/dv which
# gradients, and whether it is the TokenMask variant (kTokens).
TENSOR_CORE = re.compile(r"tensor_core\d+attention_(?P<kernel>\w+?)_kernelI(?P<element>6__half|13__nv_bfloat16)"
                         r"Li(?P<head_dim>\d+)E(?:LNS1_10TileBudgetE(?P<budget>[01])E)?"
                         r"(?:LNS1_12KeyGradientsE(?P<which>\d)E)?(?:Lb(?P<tokens>[01])E)?")
PASSES = {None: "", "0": " (dk and dv)", "1": " (dv pass)", "2": " (dk pass)"}


def parse(paths: list[str]) -> dict:
    table: dict = {}
    for path in paths:
        kernel = arch = spills = None
        for line in open(path, errors="replace"):
            if m := KERNEL.search(line):
                kernel, arch, spills = m["name"], m["arch"], None
            elif kernel and (m := SPILLS.search(line)):
                spills = int(m.group(1))
            elif kernel and (m := REGISTERS.search(line)):
                if t := TENSOR_CORE.search(kernel):
                    tokens = " (token mask)" if t["tokens"] == "1" else ""
                    small = " (99 KB tiles)" if t["budget"] == "1" else ""
                    row = (int(t["head_dim"]), t["kernel"] + PASSES[t["which"]] + small + tokens)
                    dtype = "fp16" if "half" in t["element"] else "bf16"
                    table.setdefault(row, {})[(arch, dtype)] = (int(m.group(1)), spills or 0)
                kernel = None
    return table


def markdown(table: dict) -> str:
    archs = sorted({arch for cells in table.values() for arch, _ in cells})
    lines = ["| head dim | kernel | " + " | ".join(f"{a} registers (fp16 / bf16)" for a in archs) + " | spill bytes |",
             "|---|---|" + "---|" * len(archs) + "---|"]
    for (head_dim, kernel), cells in sorted(table.items()):
        registers = [" / ".join(str(cells[(a, t)][0]) if (a, t) in cells else "-" for t in ("fp16", "bf16"))
                     for a in archs]
        spills = max(spill for _, spill in cells.values())
        lines.append(f"| {head_dim} | {kernel} | " + " | ".join(registers) + f" | {spills} |")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    print(markdown(parse(sys.argv[1:])))
