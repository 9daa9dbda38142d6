"""The benchmarks' own logic on the CPU: their correctness gates and the visible-work FLOP counts they report."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_flash import bench_segments, benchmark


@pytest.mark.parametrize("heads_kv", [None, 2])
def test_check_compares_against_the_reference(heads_kv):
    case = benchmark.Case(2, 67, 4, 32, True, "float32", heads_kv=heads_kv, window=(20, 0), softcap=10.0)
    keys = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(keys[0], (2, 67, 4, 32), jnp.float32)
    k, v = (jax.random.normal(key, (2, 67, heads_kv or 4, 32), jnp.float32) for key in keys[1:])
    err = benchmark._check(case, q, k, v)
    assert 0 <= err <= 1e-4


def test_check_rejects_a_wrong_answer(monkeypatch):
    case = benchmark.Case(1, 33, 2, 32, False, "float32")
    q, k, v = (jax.random.normal(key, (1, 33, 2, 32), jnp.float32) for key in jax.random.split(jax.random.key(1), 3))
    monkeypatch.setattr(benchmark, "_attention", lambda impl, case: lambda q, k, v: q)
    with pytest.raises(AssertionError, match="disagrees"):
        benchmark._check(case, q, k, v)


def test_fp8_case_is_forward_only_and_peers_run_on_the_same_values(monkeypatch):
    case = benchmark.Case(1, 40, 2, 32, True, benchmark.FP8)
    q, k, v = benchmark._random_inputs(case)
    assert q.dtype == jnp.float8_e4m3fn
    peer_q, _, _ = benchmark._peer_inputs(case, q, k, v)
    np.testing.assert_array_equal(np.asarray(peer_q, np.float32), np.asarray(q, np.float32))
    monkeypatch.setattr(benchmark, "_grid", lambda name, on_gpu: [case])
    # xla alone beside jax_flash: the peer every platform has (a GPU's default list adds cuDNN and others).
    rows = benchmark.run("full", ("fwd", "fwd+bwd"), 0.01, only=("xla",))
    assert sorted((r["impl"], r["part"]) for r in rows) == [("jax_flash", "fwd"), ("xla", "fwd")]
    assert all(r["ms"] > 0 and np.isfinite(r["tflops"]) for r in rows), rows  # a failed peer's row has ms = nan
    # The check passed, within the FP8 tolerance: the Hopper kernel rounds the probabilities to e4m3 (the CPU does not).
    assert next(r for r in rows if r["impl"] == "jax_flash")["max_abs_err"] <= benchmark.TOLERANCE[benchmark.FP8]


@pytest.mark.parametrize("causal, window", [(False, None), (True, None), (True, (5, 0)), (False, (3, 7))])
def test_visible_pairs_counts_the_mask(causal, window):
    case = benchmark.Case(1, 50, 1, 32, causal, "float32", window=window)
    i, j = np.meshgrid(np.arange(50), np.arange(50), indexing="ij")
    left, right = window or (50, 50)
    visible = (j >= i - left) & (j <= i + (0 if causal else right))
    expected = visible.sum() if window else 50**2 / (2 if causal else 1)  # causal alone is counted as S^2 / 2
    assert case.visible_pairs() == pytest.approx(expected)


def test_causal_visible_pairs_counts_each_document_alone():
    # Documents of 1, 2 and 3 tokens: 1 + (1 + 2) + (1 + 2 + 3) query-key pairs under a causal mask.
    assert bench_segments.causal_visible_pairs([1, 2, 3]) == 10
    i, j = np.meshgrid(np.arange(6), np.arange(6), indexing="ij")
    ids = bench_segments.segment_ids([1, 2, 3])[0]
    assert ((j <= i) & (ids[i] == ids[j])).sum() == 10
    assert bench_segments.causal_visible_pairs([6]) == 21


def test_document_lengths_cover_the_row():
    lengths = bench_segments.document_lengths(512, 8)
    assert len(lengths) == 8 and lengths.sum() == 512 and lengths.min() >= 1
    assert list(lengths) == list(bench_segments.document_lengths(512, 8))  # a fixed seed: the same row every run


def test_bench_segments_cpu_grid(tmp_path):
    out = tmp_path / "segments.json"
    bench_segments.main(["--json", str(out), "--min-seconds", "0.01"])
    result = json.loads(out.read_text())
    grid = bench_segments.CPU_GRID
    assert result["header"]["jax"] == jax.__version__ and sum(result["header"]["doc_lengths"]) == grid.seq
    rows = result["rows"]
    impls = ["jax_flash packed", "jax_flash dense causal", "jax_flash varlen", "jax_flash lengths"]
    assert sorted((r["impl"], r["part"]) for r in rows) == sorted((i, p) for i in impls for p in ("fwd", "fwd+bwd"))
    packed_pairs = bench_segments.causal_visible_pairs(result["header"]["doc_lengths"])
    dense_pairs = grid.seq * (grid.seq + 1) // 2
    for r in rows:
        assert r["error"] is None and r["max_error"] <= 1e-4  # the correctness check passed
        assert r["ms"] > 0 and r["ratio_to_dense"] > 0
        assert r["ratio_to_own_dense"] == r["ratio_to_dense"]  # every row here is jax_flash's
        pairs = dense_pairs if r["impl"] == "jax_flash dense causal" else packed_pairs
        flops = 4 * r["heads"] * r["head_dim"] * pairs * (3.5 if r["part"] == "fwd+bwd" else 1)
        assert r["tflops"] == pytest.approx(flops / (r["ms"] * 1e-3) / 1e12)


def test_bench_segments_marks_a_wrong_answer(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_segments, "_implementations", lambda on_gpu, lengths: {
        "returns q": ("packed", lambda q, k, v, ids: q)})
    out = tmp_path / "segments.json"
    # One head dim, so one row, on any machine (a GPU's default is two).
    bench_segments.main(["--json", str(out), "--parts", "fwd", "--head-dims", "32", "--min-seconds", "0.01"])
    (row,) = json.loads(out.read_text())["rows"]
    assert row["error"].startswith("wrong") and row["max_error"] > 1e-4 and row["ms"] > 0


def test_bench_segments_judges_each_implementation_by_its_own_dense_row(tmp_path, monkeypatch):
    # A peer (here jax_flash under another name) brings its own dense causal row: its packed row's ratio_to_own_dense
    # is over that row, its ratio_to_dense over jax_flash's, and a dense layout counts the whole row's pairs.
    monkeypatch.setattr(bench_segments, "_implementations", lambda on_gpu, lengths: {
        bench_segments.DENSE: ("dense", bench_segments._flash_dense),
        "peer varlen": ("varlen", bench_segments._flash_varlen),
        "peer dense causal": ("dense", bench_segments._flash_dense)})
    out = tmp_path / "segments.json"
    bench_segments.main(["--json", str(out), "--parts", "fwd", "--head-dims", "32", "--min-seconds", "0.01"])
    result = json.loads(out.read_text())
    rows = {r["impl"]: r for r in result["rows"]}
    assert all(r["error"] is None for r in rows.values())
    ours, peer, packed = rows[bench_segments.DENSE], rows["peer dense causal"], rows["peer varlen"]
    assert packed["ratio_to_own_dense"] == pytest.approx(packed["tflops"] / peer["tflops"])
    assert packed["ratio_to_dense"] == pytest.approx(packed["tflops"] / ours["tflops"])
    assert peer["ratio_to_own_dense"] == 1.0
    assert peer["tflops"] * peer["ms"] == pytest.approx(ours["tflops"] * ours["ms"])  # the same visible work


def _breakdown_documents(grid, random_lengths) -> dict:
    """--breakdown's case -> the causal documents its visible work is counted on."""
    equal = [grid.seq // grid.docs] * grid.docs
    return {"dense, one row": [grid.seq], "dense, batch of equal rows": equal, "segment ids, equal documents": equal,
            "segment ids, one segment": [grid.seq], "lengths = S": [grid.seq],
            "segment ids, random documents": random_lengths, "dense, each random document": random_lengths}


def test_bench_segments_breakdown_cpu_grid(tmp_path):
    out = tmp_path / "breakdown.json"
    bench_segments.main(["--breakdown", "--json", str(out), "--min-seconds", "0.01"])
    result = json.loads(out.read_text())
    grid = bench_segments.CPU_BREAKDOWN_GRID
    random_lengths = result["header"]["doc_lengths"]
    assert random_lengths == list(bench_segments.document_lengths(grid.seq, grid.docs)) and grid.seq % grid.docs == 0
    documents = _breakdown_documents(grid, random_lengths)
    rows = result["rows"]
    assert sorted((r["case"], r["part"]) for r in rows) == sorted((c, p) for c in documents for p in ("fwd", "fwd+bwd"))
    for r in rows:
        assert r["mode"] == "breakdown" and r["error"] is None and r["max_error"] <= 1e-4  # the check passed
        pairs = sum(n * (n + 1) // 2 for n in documents[r["case"]])
        flops = 4 * r["heads"] * r["head_dim"] * pairs * (3.5 if r["part"] == "fwd+bwd" else 1)
        assert r["flops"] == pytest.approx(flops)
        assert r["ms"] > 0 and np.isfinite(r["tflops"]) and r["tflops"] > 0
        assert r["tflops"] == pytest.approx(flops / (r["ms"] * 1e-3) / 1e12)
        assert r["ratio_to_dense"] > 0
        if r["case"] == "dense, one row":
            assert r["ratio_to_dense"] == 1.0


def test_bench_segments_breakdown_catches_a_document_leak(tmp_path, monkeypatch):
    # segment_ids ignored: the documents after the first see their predecessors, which only the check can tell.
    monkeypatch.setattr(bench_segments, "_flash_packed", bench_segments._flash_dense)
    out = tmp_path / "breakdown.json"
    bench_segments.main(["--breakdown", "--json", str(out), "--parts", "fwd", "--min-seconds", "0.01"])
    wrong = {r["case"] for r in json.loads(out.read_text())["rows"] if (r["error"] or "").startswith("wrong")}
    assert wrong == {"segment ids, equal documents", "segment ids, random documents"}


def test_json_is_written_when_the_grid_selects_no_case(tmp_path):
    out = tmp_path / "none.json"
    benchmark.main(["--grid", "demo", "--seqs", "3", "--json", str(out)])
    assert json.loads(out.read_text())["rows"] == []


def test_head_dims_keeps_only_those_cases(tmp_path):
    out = tmp_path / "d64.json"
    shortest = str(min(case.seq for case in benchmark._grid("demo", jax.default_backend() == "gpu")))
    benchmark.main(["--grid", "demo", "--seqs", shortest, "--head-dims", "64", "--parts", "fwd", "--min-seconds",
                    "0.001", "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert rows and {r["head_dim"] for r in rows} == {64}


def test_masks_keeps_only_those_cases(tmp_path):
    out = tmp_path / "causal.json"
    shortest = str(min(case.seq for case in benchmark._grid("demo", jax.default_backend() == "gpu")))
    benchmark.main(["--grid", "demo", "--seqs", shortest, "--head-dims", "64", "--masks", "causal", "--parts", "fwd",
                    "--min-seconds", "0.001", "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert rows and all(r["causal"] for r in rows)


def test_masks_refuses_an_unknown_mask():
    with pytest.raises(SystemExit):
        benchmark.main(["--grid", "demo", "--masks", "casual"])
