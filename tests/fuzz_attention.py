"""Random cases against the float64 reference, beyond the fixed ones of the test suite:

    python tests/fuzz_attention.py [--platform gpu] [--cases 300] [--seed 1] [--only 12,40]

Each attention case draws a shape (lengths 1 to 300, Sq != Sk, GQA ratios 1 to 4, head dims 8 to 256), a dtype and a
mask (causal, windows, soft cap, segment ids with or without positions, lengths) and checks the output and the three
gradients with test_segments.check_case, the suite's own rule; each decode case draws a cache (contiguous or paged),
ragged lengths, q_len 1 to 16, GQA, a window and a soft cap, and checks it with test_decode.check_random_case. A
failure prints its case and the case's index: `--only INDEX` runs it again with the same data. Exits 1 if any failed.
Run it from outside the source tree with the tests folder on PYTHONPATH, e.g.
`cd /tmp && PYTHONPATH=<checkout>/tests python <checkout>/tests/fuzz_attention.py --platform gpu`.
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import numpy as np

jax.config.update("jax_enable_x64", True)  # the float64 references, as conftest.py sets for the suite

import test_decode  # noqa: E402
import test_segments  # noqa: E402
from test_segments import Case  # noqa: E402


def attention_case(rng: np.random.Generator) -> Case:
    seq_q = int(rng.choice([1, 2, 17, 63, 64, 65, 113, 127, 129, 200, 257, 300]))
    seq_k = seq_q if rng.random() < 0.6 else int(rng.choice([1, 5, 17, 64, 113, 130, 255, 300]))
    heads_kv = int(rng.choice([1, 2]))
    window = None
    if rng.random() < 0.3:
        symmetric = rng.random() < 0.5
        window = int(rng.integers(0, 50)) if symmetric else (int(rng.integers(0, 60)), int(rng.integers(0, 60)))
    segments = bool(rng.random() < 0.7)
    return Case(seq_q, seq_k, dtype=str(rng.choice(["float32", "bfloat16", "float16"])),
                heads=(heads_kv * int(rng.choice([1, 2, 3, 4])), heads_kv), segments=segments,
                positions=segments and bool(rng.random() < 0.4), lengths=str(rng.choice(["", "q", "kv", "both"])),
                is_causal=bool(rng.random() < 0.5), window=window,
                softcap=float(rng.choice([5.0, 30.0])) if rng.random() < 0.3 else None,
                batch=int(rng.integers(1, 4)), head_dim=int(rng.choice([8, 16, 32, 40, 64, 80, 96, 128, 160, 256])))


def decode_case(rng: np.random.Generator) -> tuple:
    """test_decode.CASES' fields: (batch, max_len, q_len, heads_q, heads_kv, head_dim, dtype, extra)."""
    heads_kv = int(rng.choice([1, 2, 4]))
    extra = {}
    if rng.random() < 0.3:
        extra["local_window_size"] = int(rng.integers(0, 40)) if rng.random() < 0.5 else (int(rng.integers(0, 40)), 0)
    if rng.random() < 0.3:
        extra["softcap"] = float(rng.choice([2.0, 20.0]))
    return (int(rng.integers(1, 6)), int(rng.choice([1, 16, 17, 63, 200, 513, 2100])), int(rng.integers(1, 17)),
            heads_kv * int(rng.choice([1, 2, 4, 8])), heads_kv,
            int(rng.choice([8, 16, 32, 40, 64, 80, 96, 128, 200, 256])),
            str(rng.choice(["float32", "bfloat16", "float16"])), extra)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--platform", default="cpu", choices=["cpu", "gpu"])
    parser.add_argument("--cases", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--only", default="", help="comma-separated case indices to run again")
    args = parser.parse_args()
    only = {int(i) for i in args.only.split(",") if i}
    master = np.random.default_rng(args.seed)
    failed = 0
    for index in range(args.cases):
        rng = np.random.default_rng(master.integers(1 << 62))  # one stream per case, so --only replays it
        if only and index not in only:
            continue
        start = time.time()
        if index % 4 == 3:
            case = decode_case(rng)
            check = lambda: test_decode.check_random_case(args.platform, rng, *case)  # noqa: E731
        else:
            case = attention_case(rng)
            check = lambda: test_segments.check_case(case, args.platform, rng)  # noqa: E731
        try:
            check()
            status = "ok"
        except Exception as error:  # noqa: BLE001  (report every failure and go on)
            failed += 1
            status = f"FAILED {type(error).__name__}: {str(error)[:500]}"
        name = case.id() if isinstance(case, Case) else case
        print(f"{index} {name} {time.time() - start:.1f}s {status}", flush=True)
    print(f"{failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
