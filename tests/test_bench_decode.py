"""The decode benchmark's own logic on the CPU: every timing reported, wrong answers caught."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_flash import bench_decode

# These two read the CPU's answers: its float32 grid and 4-byte K/V, and float32 agreement with jax.nn's xla output
# to 1e-4, which a GPU's default TF32 matmuls miss. On a GPU the benchmark itself is what runs (bf16, its own grid).
cpu_backend_only = pytest.mark.skipif(jax.default_backend() != "cpu",
                                      reason="the CPU's float32 grid; a GPU runs the benchmark itself")


@cpu_backend_only
def test_every_implementation_gets_every_timing():
    impls = bench_decode._implementations(on_gpu=False)
    reps = dict.fromkeys(bench_decode.TIMINGS, 2)
    records = bench_decode.run_case(2, 80, jnp.float32, impls, reps, np.random.default_rng(0))
    assert {r["implementation"] for r in records} == set(impls)
    kv_bytes = 2 * 2 * 80 * bench_decode.HEADS_KV * bench_decode.HEAD_DIM * 4
    for r in records:
        assert "error" not in r, r
        assert r["max_abs_diff_vs_xla"] <= bench_decode.TOLERANCE["float32"]
        assert r["us_call_dispatch_floor"] == records[0]["us_call_dispatch_floor"] > 0
        for timing in bench_decode.TIMINGS:
            assert 0 < r[f"us_{timing}_host"] <= r[f"us_{timing}"]
            assert r[f"gb_per_s_{timing}"] == pytest.approx(kv_bytes / r[f"us_{timing}"] / 1e3)


@cpu_backend_only
def test_head_dim_sets_the_shapes_and_the_bytes(tmp_path):
    pytest.importorskip("matplotlib")
    out, png = tmp_path / "d64.json", tmp_path / "d64.png"
    bench_decode.main(["--head-dim", "64", "--reps", "1", "--json", str(out), "--plot", str(png)])
    written = json.loads(out.read_text())
    records = written["records"]
    assert written["copy_gb_per_s"] > 0
    assert records and {r["head_dim"] for r in records} == {64}
    for r in records:
        kv_bytes = 2 * r["batch"] * r["length"] * r["heads_kv"] * 64 * 4
        for timing in bench_decode.TIMINGS:
            assert r[f"gb_per_s_{timing}"] == pytest.approx(kv_bytes / r[f"us_{timing}"] / 1e3)
    assert png.stat().st_size > 0


def test_the_ratio_is_the_fastest_peers_time_over_ours():
    records = [dict(implementation="jax_flash", us_loop=10.0, us_unrolled=8.0),
               dict(implementation="a", us_loop=12.0, us_unrolled=6.0),
               dict(implementation="b", us_loop=11.0, us_unrolled=9.0),
               dict(implementation="c", error="RuntimeError: no")]
    bench_decode._compare_to_peers(records)
    ours = records[0]
    assert ours["best_peer_loop"] == "b" and ours["ratio_to_best_peer_loop"] == pytest.approx(1.1)
    assert ours["best_peer_unrolled"] == "a" and ours["ratio_to_best_peer_unrolled"] == pytest.approx(0.75)


def test_the_paged_run_is_compared_with_the_contiguous_one_and_is_no_peer():
    records = [dict(implementation="jax_flash", us_call=10.0, gb_per_s_call=3000.0),
               dict(implementation=bench_decode.PAGED, us_call=10.5),
               dict(implementation="a", us_call=12.0)]
    for r in records:
        r.update({f"{key}_{timing}": r[f"{key}_call"] for key in ("us", "gb_per_s") if f"{key}_call" in r
                  for timing in bench_decode.TIMINGS})
    bench_decode._compare_to_peers(records, copy_gb_per_s=4000.0)
    ours = records[0]
    for timing in bench_decode.TIMINGS:
        assert ours[f"best_peer_{timing}"] == "a" and ours[f"ratio_to_best_peer_{timing}"] == pytest.approx(1.2)
        assert ours[f"paged_over_contiguous_{timing}"] == pytest.approx(1.05)
        assert ours[f"fraction_of_copy_{timing}"] == pytest.approx(0.75)


def test_the_paged_pools_hold_the_same_cache():
    rng = np.random.default_rng(3)
    k = jnp.asarray(rng.standard_normal((3, 150, 2, 8)), jnp.float32)  # 150: the last page is partial
    key_pages, value_pages, table = bench_decode._paged(k, -k, rng)
    page = bench_decode.PAGE_SIZE
    assert key_pages.shape == (3 * -(-150 // page), page, 2, 8) and table.shape == (3, -(-150 // page))
    gathered = key_pages[table].reshape(3, -1, 2, 8)[:, :150]  # sequence b's pages in order
    np.testing.assert_array_equal(gathered, k)
    np.testing.assert_array_equal(value_pages, -key_pages)
    assert sorted(np.asarray(table).ravel().tolist()) == list(range(table.size))  # each pool slot used once


def test_a_wrong_answer_is_reported_and_not_timed():
    impls = bench_decode._implementations(on_gpu=False)
    impls["jax_flash"] = lambda q, k, v, n: q  # the query echoed back: no attention at all
    reps = dict.fromkeys(bench_decode.TIMINGS, 1)
    records = bench_decode.run_case(1, 48, jnp.float32, impls, reps, np.random.default_rng(1))
    wrong = {r["implementation"]: r for r in records if "error" in r}
    assert set(wrong) == {"jax_flash"}
    assert wrong["jax_flash"]["error"].startswith("ValueError: wrong answer")
    assert not any(key.startswith("us_") for key in wrong["jax_flash"])


def test_cases_option_picks_the_shapes(tmp_path):
    out = tmp_path / "cases.json"
    bench_decode.main(["--cases", "1x32,2x48", "--reps", "1", "--json", str(out)])
    records = json.loads(out.read_text())["records"]
    assert [(r["batch"], r["length"]) for r in records if r["implementation"] == "jax_flash"] == [(1, 32), (2, 48)]
    with pytest.raises(SystemExit):
        bench_decode.main(["--cases", "8by4096"])
