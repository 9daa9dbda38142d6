"""Packed-documents benchmark: one row of causal documents of random lengths, beside dense causal attention.

    python -m jax_flash.bench_segments [--breakdown] [--json out.json] [--head-dims 64,128] [--parts fwd,fwd+bwd]
                                       [--min-seconds 0.2]

On a GPU: bfloat16, one packed row of S = 16384 tokens holding 8 documents of random lengths (fixed seed, no
padding), H * D = 2048. On the CPU: float32, S = 512, 3 documents, H * D = 64, so it runs in seconds. All in one
process, on the same q/k/v:

    jax_flash packed        the row with segment_ids (each document sees only itself, causally)
    jax_flash dense causal  the same row as one causal sequence: the reference speed
    jax_flash varlen        the row as [S, H, D] with cumulative document offsets (varlen_attention)
    jax_flash lengths       the documents as a padded batch [docs, max_len, H, D] with the *_seq_lengths
    cudnn lengths           (GPU) the same padded batch through jax.nn's cuDNN path
    cudnn dense causal      (GPU) the row as one causal sequence through it
    fa3_jax varlen          (GPU, flash-attn3-jax installed) the offsets layout through flash_mha_varlen, told the
                            longest document as it would be in training
    fa3_jax dense causal    (the same) the row as one causal sequence through flash_mha

TFLOP/s are counted on visible work only: forward 4 * H * D * (visible (query, key) pairs), forward+backward 3.5x
that (benchmark.py's convention). A causal document of length L has L (L + 1) / 2 visible pairs, so the packed and
padded layouts share one count and dense causal counts S (S + 1) / 2. Every implementation's forward is checked per
document against the float32 reference before it is timed; a wrong answer is reported on its rows, not raised.
Each row's ratio_to_dense is over jax_flash's dense causal row (issue 7's measure); ratio_to_own_dense is over the
dense causal row of its own implementation, so the peers' packed layouts are judged the same way.

--breakdown times jax_flash alone, causal, on the same q/k/v in seven layouts that separate where packed documents
lose time: the dense row, the row reshaped into a batch of `docs` equal rows, the same equal documents as segment_ids,
one segment covering the row, lengths = S, the random documents above, and each random document as a dense causal
call of its own (the calls timed one by one and summed: dense attention on exactly the packed row's visible work).
Each row's ratio is its TFLOP/s (visible work) over the dense row's. The CPU breakdown packs 4 documents, since 3 do
not divide S = 512 into equal rows.
"""

from __future__ import annotations

import argparse
import json
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

import jax_flash
from jax_flash.benchmark import TOLERANCE, _fa3, _fwd_bwd, _time, comma_ints
from jax_flash.reference import attention_reference


class Grid(NamedTuple):
    dtype: str
    seq: int
    docs: int
    hidden: int  # heads * head_dim
    head_dims: tuple[int, ...]


GPU_GRID = Grid("bfloat16", 16384, 8, 2048, (64, 128))
CPU_GRID = Grid("float32", 512, 3, 64, (32,))
# --breakdown reshapes the row into `docs` equal rows, so docs must divide S: 3 does not divide 512.
CPU_BREAKDOWN_GRID = CPU_GRID._replace(docs=4)
DENSE = "jax_flash dense causal"
ONE_ROW = "dense, one row"  # the --breakdown case the others' ratios are over
# --breakdown checks the output's first rows only: on the GPU grid they span the first boundary of the equal documents
# (2048 tokens each) and two of the random ones, and the reference's CHECKED_ROWS^2 logits per head are no more than
# the main mode's longest document (3498 tokens) costs.
CHECKED_ROWS = 4096


def document_lengths(seq: int, docs: int, seed: int = 0) -> np.ndarray:
    """`docs` lengths summing to `seq`, each >= 1: the row cut at docs - 1 distinct uniform points."""
    cuts = np.sort(np.random.default_rng(seed).choice(np.arange(1, seq), size=docs - 1, replace=False))
    return np.diff(np.concatenate([[0], cuts, [seq]]))


def causal_visible_pairs(lengths) -> int:
    """(query, key) pairs a causal mask lets through, summed over documents of these lengths."""
    return int(sum(int(n) * (int(n) + 1) // 2 for n in lengths))


def segment_ids(lengths) -> np.ndarray:
    """[1, sum(lengths)] int32: token t's document number."""
    return np.repeat(np.arange(len(lengths), dtype=np.int32), lengths)[None]


def document_starts(lengths) -> np.ndarray:
    """Each document's first token in the packed row."""
    return np.concatenate([[0], np.cumsum(lengths)[:-1]])


def to_padded_batch(x, lengths):
    """[1, S, H, D] packed -> [docs, max(lengths), H, D], each document at the start of its row, zeros after."""
    width = int(max(lengths))
    rows = [jnp.pad(x[0, s:s + n], ((0, width - n), (0, 0), (0, 0))) for s, n in zip(document_starts(lengths), lengths)]
    return jnp.stack(rows)


class Layout(NamedTuple):
    """An implementation's inputs: q, k, v and the mask operand passed to it as a jit argument (not a constant)."""
    q: jax.Array
    k: jax.Array
    v: jax.Array
    mask: jax.Array | None


def _flash_packed(q, k, v, ids):
    return jax_flash.dot_product_attention(q, k, v, is_causal=True, segment_ids=ids)


def _flash_dense(q, k, v, _):
    return jax_flash.dot_product_attention(q, k, v, is_causal=True)


def _flash_varlen(q, k, v, offsets):
    return jax_flash.varlen_attention(q[0], k[0], v[0], offsets, offsets, is_causal=True)[None]


def _fa3_varlen(longest: int):
    """flash-attn3-jax's packed-sequence attention on the offsets layout (call only where benchmark._fa3() found the
    package)."""
    from flash_attn3_jax import flash_mha_varlen

    def attend(q, k, v, offsets):
        return flash_mha_varlen(q[0], k[0], v[0], offsets, offsets, max_seqlen_q=longest, max_seqlen_k=longest,
                                is_causal=True)[None]
    return attend


def _by_lengths(implementation):
    def attend(q, k, v, lengths):
        return implementation(q, k, v, is_causal=True, query_seq_lengths=lengths, key_value_seq_lengths=lengths)
    return attend


def _cudnn(q, k, v, **kwargs):
    return jax.nn.dot_product_attention(q, k, v, **kwargs, implementation="cudnn")


def _implementations(on_gpu: bool, lengths) -> dict:
    """name -> (layout name, attend(q, k, v, mask) -> out). Each name starts with its implementation's name, and an
    implementation with a dense causal row names it "<implementation> dense causal"."""
    impls = {"jax_flash packed": ("packed", _flash_packed), DENSE: ("dense", _flash_dense),
             "jax_flash varlen": ("varlen", _flash_varlen),
             "jax_flash lengths": ("padded", _by_lengths(jax_flash.dot_product_attention))}
    if on_gpu:
        impls["cudnn lengths"] = ("padded", _by_lengths(_cudnn))
        impls["cudnn dense causal"] = ("dense", lambda q, k, v, _: _cudnn(q, k, v, is_causal=True))
        fa3 = _fa3()
        if fa3:
            impls["fa3_jax varlen"] = ("varlen", _fa3_varlen(int(max(lengths))))
            impls["fa3_jax dense causal"] = ("dense", lambda q, k, v, _: fa3(q, k, v, is_causal=True))
    return impls


def _layouts(q, k, v, lengths) -> dict[str, Layout]:
    padded = [to_padded_batch(x, lengths) for x in (q, k, v)]
    return {"packed": Layout(q, k, v, jnp.asarray(segment_ids(lengths))),
            "varlen": Layout(q, k, v, jnp.asarray(np.concatenate([[0], np.cumsum(lengths)]), jnp.int32)),
            "dense": Layout(q, k, v, None),
            "padded": Layout(*padded, jnp.asarray(lengths, jnp.int32))}


def _per_document(out, layout_name: str, lengths) -> list:
    """The output's rows of each document: slices of the row (packed, varlen, dense), or each padded row's first
    L_i rows."""
    if layout_name == "padded":
        return [out[i, :n] for i, n in enumerate(lengths)]
    return [out[0, s:s + n] for s, n in zip(document_starts(lengths), lengths)]


def _document_references(q, k, v, lengths, heads: list[int]) -> list:
    """Each document alone under a causal mask, in float32, on `heads` only: the reference materialises L x L logits
    per head, and a head subset keeps that small at S = 16k while still catching a head mixed up with another."""
    with jax.default_matmul_precision("highest"):  # XLA's default float32 matmuls on a GPU are TF32
        return [attention_reference(*(x[:, heads].astype(jnp.float32)[None] for x in docs), scale=q.shape[-1] ** -0.5,
                                    window_right=0)[0]
                for docs in zip(*(_per_document(x, "packed", lengths) for x in (q, k, v)))]


def _check(attend, layout: Layout, layout_name: str, lengths, references, heads, dtype: str):
    """(max abs error over the documents, None or why the check failed)."""
    out = jax.jit(attend)(layout.q, layout.k, layout.v, layout.mask)
    docs = _per_document(out[..., heads, :].astype(jnp.float32), layout_name, lengths)
    if layout_name == "dense":  # dense causal lets each document see its predecessors: only the first one matches
        docs, references = docs[:1], references[:1]
    return _judged(max(float(jnp.max(jnp.abs(ours - ref))) for ours, ref in zip(docs, references)), dtype)


def _judged(err: float, dtype: str):
    """(err, None or why the check failed)."""
    if not err <= TOLERANCE[dtype]:
        return err, f"wrong: max abs error {err:.3g} > {TOLERANCE[dtype]:g}"
    return err, None


def _checked(check: Callable):
    """check()'s (max error, None or why wrong), or (None, the error) when the forward did not run at all."""
    try:
        return check()
    except Exception as e:  # an implementation that refuses its layout (cudnn) is reported, not fatal
        return None, _error_text(e)


def _timed(attend, layout: Layout, part: str, min_seconds: float) -> float:
    if part == "fwd":
        fn = jax.jit(attend)
    else:
        fn = jax.jit(lambda q, k, v, mask: _fwd_bwd(lambda q, k, v: attend(q, k, v, mask))(q, k, v))
    return _time(fn, tuple(layout), min_seconds)


def _timed_row_fields(attend, layouts: list[Layout], part: str, min_seconds: float, flops: float) -> dict:
    """A row's ms and tflops (the layouts' calls timed one by one, added up), or the error that stopped the timing."""
    try:
        seconds = sum(_timed(attend, layout, part, min_seconds) for layout in layouts)
        return dict(ms=seconds * 1e3, tflops=flops / seconds / 1e12)
    except Exception as e:
        return dict(error=_error_text(e))


def _visible_flops(heads: int, head_dim: int, lengths, part: str) -> float:
    """benchmark.py's convention on the visible work: 4 * H * D per visible pair forward, 3.5x that forward+backward."""
    return 4 * heads * head_dim * causal_visible_pairs(lengths) * (3.5 if part == "fwd+bwd" else 1.0)


def _error_text(error: Exception) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0][:200] if lines else ''}"


def _random_qkv(grid: Grid, head_dim: int):
    """[1, S, H, D] each, H = hidden // head_dim; the same arrays in both modes."""
    keys = jax.random.split(jax.random.key(head_dim), 3)
    return tuple(jax.random.normal(key, (1, grid.seq, grid.hidden // head_dim, head_dim), grid.dtype) for key in keys)


def run_head_dim(grid: Grid, head_dim: int, lengths, parts, min_seconds: float, impls: dict) -> list[dict]:
    heads = grid.hidden // head_dim
    q, k, v = _random_qkv(grid, head_dim)
    layouts = _layouts(q, k, v, lengths)
    checked_heads = sorted({0, heads - 1})
    references = _document_references(q, k, v, lengths, checked_heads)
    rows = []
    for name, (layout_name, attend) in impls.items():
        layout = layouts[layout_name]
        max_error, error = _checked(
            lambda: _check(attend, layout, layout_name, lengths, references, checked_heads, grid.dtype))
        for part in parts:
            row = dict(impl=name, part=part, head_dim=head_dim, heads=heads, seq=grid.seq, docs=len(lengths),
                       ms=None, tflops=None, max_error=max_error, error=error)
            if max_error is not None:  # it ran: time it, even when wrong, so the row still says how fast
                flops = _visible_flops(heads, head_dim, [grid.seq] if layout_name == "dense" else lengths, part)
                row.update(_timed_row_fields(attend, [layout], part, min_seconds, flops))
            rows.append(row)
    _add_ratios(rows, lambda r: r["impl"] == DENSE)
    for family in {r["impl"].split()[0] for r in rows}:
        _add_ratios([r for r in rows if r["impl"].split()[0] == family],
                    lambda r, family=family: r["impl"] == f"{family} dense causal", key="ratio_to_own_dense")
    return rows


class BreakdownCase(NamedTuple):
    name: str
    attend: Callable  # (q, k, v, mask) -> out, all jax_flash causal
    layouts: list[Layout]  # one call each, in the row's token order; their times add up
    documents: list  # the causal documents the row holds, in order: its visible work, and what the check masks by


def _breakdown_cases(q, k, v, lengths) -> list[BreakdownCase]:
    """The seven --breakdown layouts of one [1, S, H, D] row and its random document lengths."""
    seq, docs = q.shape[1], len(lengths)
    assert seq % docs == 0, f"--breakdown splits the row into {docs} equal documents: S = {seq} must be a multiple"
    equal = [seq // docs] * docs
    as_rows = [x.reshape(docs, seq // docs, *x.shape[2:]) for x in (q, k, v)]

    def ids(documents):
        return jnp.asarray(segment_ids(documents))

    random = [int(n) for n in lengths]
    each_document = [Layout(*(x[:, s:s + n] for x in (q, k, v)), None) for s, n in zip(document_starts(random), random)]
    return [BreakdownCase(ONE_ROW, _flash_dense, [Layout(q, k, v, None)], [seq]),
            BreakdownCase("dense, batch of equal rows", _flash_dense, [Layout(*as_rows, None)], equal),
            BreakdownCase("segment ids, equal documents", _flash_packed, [Layout(q, k, v, ids(equal))], equal),
            BreakdownCase("segment ids, one segment", _flash_packed, [Layout(q, k, v, ids([seq]))], [seq]),
            BreakdownCase("lengths = S", _by_lengths(jax_flash.dot_product_attention),
                          [Layout(q, k, v, jnp.array([seq], jnp.int32))], [seq]),
            BreakdownCase("segment ids, random documents", _flash_packed, [Layout(q, k, v, ids(lengths))], random),
            BreakdownCase("dense, each random document", _flash_dense, each_document, random)]


def _check_first_rows(case: BreakdownCase, q, k, v, heads: list[int], dtype: str):
    """(max abs error, None or why wrong) of the forward's first CHECKED_ROWS rows, in the row's token order, on
    `heads`. Each token sees only earlier tokens of its document, so those rows depend on the first CHECKED_ROWS tokens
    alone: the float32 reference runs on that prefix, masked by the case's documents, and is exact for it."""
    rows = min(q.shape[1], CHECKED_ROWS)
    attend = jax.jit(case.attend)
    # The calls' outputs back into one row (a batch of equal rows, or one call per document).
    out = jnp.concatenate([attend(*layout).reshape(1, -1, *q.shape[2:]) for layout in case.layouts], axis=1)
    ours = out[:, :rows, heads].astype(jnp.float32)
    ids = jnp.asarray(segment_ids(case.documents)[:, :rows])
    with jax.default_matmul_precision("highest"):  # XLA's default float32 matmuls on a GPU are TF32
        ref = attention_reference(*(x[:, :rows, heads].astype(jnp.float32) for x in (q, k, v)),
                                  scale=q.shape[-1] ** -0.5, window_right=0, q_segment_ids=ids, kv_segment_ids=ids)
    return _judged(float(jnp.max(jnp.abs(ours - ref))), dtype)


def run_breakdown(grid: Grid, head_dim: int, lengths, parts, min_seconds: float) -> list[dict]:
    heads = grid.hidden // head_dim
    q, k, v = _random_qkv(grid, head_dim)
    checked_heads = sorted({0, heads - 1})
    rows = []
    for case in _breakdown_cases(q, k, v, lengths):
        max_error, error = _checked(lambda: _check_first_rows(case, q, k, v, checked_heads, grid.dtype))
        for part in parts:
            flops = _visible_flops(heads, head_dim, case.documents, part)
            row = dict(mode="breakdown", case=case.name, part=part, head_dim=head_dim, heads=heads, seq=grid.seq,
                       docs=len(case.documents), flops=flops, ms=None, tflops=None,
                       max_error=max_error, error=error)
            if max_error is not None:  # it ran: time it, even when wrong, so the row still says how fast
                row.update(_timed_row_fields(case.attend, case.layouts, part, min_seconds, flops))
            rows.append(row)
    _add_ratios(rows, lambda r: r["case"] == ONE_ROW)
    return rows


def _add_ratios(rows: list[dict], is_dense: Callable[[dict], bool], key: str = "ratio_to_dense") -> None:
    """rows[key]: TFLOP/s over the dense causal row's on the same part (issue 7's target: packed >= 0.9), None where
    either did not run."""
    dense = {r["part"]: r["tflops"] for r in rows if is_dense(r)}
    for r in rows:
        r[key] = r["tflops"] / dense[r["part"]] if r["tflops"] is not None and dense.get(r["part"]) else None


CASE_WIDTH = len("segment ids, random documents")  # the longest breakdown case name


def format_row(r: dict) -> str:
    name = f"{r['case']:{CASE_WIDTH}s}" if r.get("mode") == "breakdown" else f"{r['impl']:22s}"
    label = f"D={r['head_dim']:3d} H={r['heads']:3d} {r['part']:7s} {name}"
    if r["ms"] is None:
        return f"{label} failed: {r['error']}"
    ratio = f"{r['ratio_to_dense']:5.2f}x dense" if r["ratio_to_dense"] is not None else " " * 11
    own = r.get("ratio_to_own_dense")
    ratio += f" {own:5.2f}x own dense" if own is not None else " " * 16
    shown = f"{label} {r['ms']:9.3f} ms {r['tflops']:8.2f} TFLOP/s {ratio}  max err {r['max_error']:.1e}"
    return shown + (f"  {r['error']}" if r["error"] else "")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--breakdown", action="store_true",
                        help="time jax_flash alone in seven layouts of the row (dense, equal rows, segment ids, "
                             "lengths, each document alone)")
    parser.add_argument("--json", help="write the header and every row to this JSON file")
    parser.add_argument("--head-dims", type=comma_ints,
                        help="comma-separated head dims (default 64,128 on a GPU, 32 on the CPU)")
    parser.add_argument("--parts", default="fwd,fwd+bwd", help="comma-separated subset of fwd,fwd+bwd")
    parser.add_argument("--min-seconds", type=float, default=0.2, help="time per repeat, at least one call")
    args = parser.parse_args(argv)
    on_gpu = jax.default_backend() == "gpu"
    grid = GPU_GRID if on_gpu else CPU_BREAKDOWN_GRID if args.breakdown else CPU_GRID
    if args.head_dims:
        grid = grid._replace(head_dims=args.head_dims)
    lengths = document_lengths(grid.seq, grid.docs)
    visible = causal_visible_pairs(lengths) / causal_visible_pairs([grid.seq])
    header = dict(jax=jax.__version__, jax_flash=jax_flash.__version__, device=jax.devices()[0].device_kind,
                  dtype=grid.dtype, seq=grid.seq, doc_lengths=[int(n) for n in lengths])
    print(f"jax_flash {jax_flash.__version__} on {header['device']}, jax {jax.__version__}; {grid.dtype}, one row of "
          f"S={grid.seq}, H*D={grid.hidden}; document lengths {header['doc_lengths']} "
          f"({visible:.1%} of dense causal's visible pairs)", flush=True)
    if args.breakdown:
        print(f"breakdown: jax_flash causal only; equal documents {grid.docs} x {grid.seq // grid.docs}; "
              f"ratios are TFLOP/s over {ONE_ROW!r}", flush=True)
    impls, parts = _implementations(on_gpu, lengths), args.parts.split(",")
    rows = []
    for head_dim in grid.head_dims:
        if args.breakdown:
            head_rows = run_breakdown(grid, head_dim, lengths, parts, args.min_seconds)
        else:
            head_rows = run_head_dim(grid, head_dim, lengths, parts, args.min_seconds, impls)
        for r in sorted(head_rows, key=lambda r: parts.index(r["part"])):  # each part's implementations together
            print(format_row(r), flush=True)
        rows += head_rows
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(header=header, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
