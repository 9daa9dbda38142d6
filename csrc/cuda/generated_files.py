"""The command line both kernel generators share: write, check or list a folder of generated files.

Each generator (tensor_core/ and hopper/generate_instantiations.py) computes {path: text} from its tables and calls
run(); the folder then holds exactly those files, and --check fails on any difference (CI runs it through
tests/test_generated_kernels.py).
"""

from __future__ import annotations

import argparse
import pathlib
import sys


def run(description: str, folder: pathlib.Path, files: dict[pathlib.Path, str], listing: str) -> int:
    """`listing` is what --list prints for CMake."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help=f"fail if {folder.name}/ differs from the tables")
    parser.add_argument("--list", action="store_true", help="print what CMake needs from the tables")
    args = parser.parse_args()
    if args.list:
        print(listing)
        return 0
    present = set(folder.glob("*")) if folder.exists() else set()
    if args.check:
        stale = [p for p, text in files.items() if not p.exists() or p.read_text() != text]
        extra = sorted(present - set(files))
        for path in stale + extra:
            print(f"stale: {path.relative_to(folder.parent)}; rerun the generator", file=sys.stderr)
        return 1 if stale or extra else 0
    folder.mkdir(exist_ok=True)
    for old in present - set(files):
        old.unlink()
    for path, text in files.items():
        path.write_text(text)
    return 0
