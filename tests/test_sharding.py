"""jax_flash on a mesh of 8 CPU devices: under jit with NamedShardings, inside shard_map, ring attention, and decode.

The multi-device programs run in a fresh process (sharding_checks.py), because the fake devices must be requested
before JAX starts and this process started it long ago. Each check compares forward and gradients with the same call
unsharded on one device; the batch/head ones also assert that the compiled program gathers nothing. The rules
behind the partitioning and the ring layout are tested here directly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from jax.sharding import AbstractMesh

import jax_flash
from jax_flash import _partitioning

# Relative to the largest magnitude of each output. Batch and head sharding run the very same kernel on each slice
# (exact, except dk/dv summed over devices in another order); ring attention merges float32 partial results.
TOLERANCE = 5e-6


def _run_checks(group: str) -> list[dict]:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    script = Path(__file__).with_name("sharding_checks.py")
    done = subprocess.run([sys.executable, str(script), group], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"sharding_checks.py {group} failed:\n{done.stderr[-5000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def _failures(result: dict, *, gathers_allowed: bool) -> list[str]:
    found = [f"{name} error {error:.2e} > {TOLERANCE}" for name, error in result["errors"].items() if error > TOLERANCE]
    if result["devices"] != 8:
        found.append(f"ran on {result['devices']} devices, not 8")
    if result["kernel_calls"] < 2:
        found.append("the jax_flash kernels are not in the compiled program")
    if not gathers_allowed and result["all_gather"]:
        found.append("the compiled program has an all-gather")
    if result.get("out_sharding_kept") is False:
        found.append("the output lost the query's sharding")
    return [f"{result['check']}: {f}" for f in found]


def _assert_all_pass(group: str, *, gathers_allowed: bool = False) -> list[dict]:
    results = _run_checks(group)
    failures = [f for r in results for f in _failures(r, gathers_allowed=gathers_allowed)]
    assert not failures, "\n".join(failures)
    return results


def test_jit_on_named_shardings_runs_each_shard_locally():
    results = _assert_all_pass("jit")
    assert {r["check"] for r in results} >= {"batch", "heads", "batch_x_heads", "batch_x_heads_explicit_mesh",
                                             "batch_x_heads_gspmd", "gqa_group_split", "mqa_kv_replicated"}


def test_inside_shard_map():
    _assert_all_pass("shard_map")


def test_segment_ids_and_lengths_follow_the_batch_sharding():
    _assert_all_pass("tokens")


def test_decode_and_the_cache_update_keep_the_cache_sharding():
    results = _run_checks("decode")
    # A paged pool's pages stay whole on every device, so the update gathers the batch's new rows (not the cache);
    # where the query's heads and the cache's batch share an axis, the query is resharded to the cache's layout.
    gathers = {"decode_paged_heads", "decode_axis_conflict"}
    failures = [f for r in results for f in _failures(r, gathers_allowed=r["check"] in gathers)]
    failures += [f"{r['check']}: the updated cache lost its sharding" for r in results if not r["cache_sharding_kept"]]
    assert not failures, "\n".join(failures)
    assert {r["check"] for r in results} == {"decode_batch_x_heads", "decode_heads_query_replicated",
                                             "decode_batch_x_heads_gspmd", "decode_mqa", "decode_paged_heads",
                                             "decode_shard_map", "decode_axis_conflict"}


def test_ring_attention_matches_unsharded_call():
    results = _assert_all_pass("ring")
    assert all(r["collective_permute"] for r in results)


# ---------------------------------------------------------------------------------------------------------------------
# The rules, without devices.


@pytest.mark.parametrize("heads_q,heads_kv,requested,expected", [
    (4, 2, ("tp",), (("tp",), ("tp",))),                       # kv heads split with their query groups
    (8, 2, ("tp", "dp"), (("tp", "dp"), ("tp",))),             # then 'dp' splits each group
    (4, 1, ("tp",), (("tp",), ())),                            # MQA: the single kv head is replicated
    (8, 2, ("dp",), ((), ())),                                 # 4 shards would cut a kv head in two: not split
    (8, 2, ("dp", "tp"), ((), ())),
    (12, 4, ("tp", "dp"), (("tp",), ("tp",))),                 # 'dp' left off: kv heads not all split yet
], ids=["gqa", "group-split", "mqa", "uneven", "uneven-first", "partial"])
def test_head_axes(heads_q, heads_kv, requested, expected):
    mesh = AbstractMesh((4, 2), ("dp", "tp"))
    assert _partitioning.head_axes(mesh, requested, heads_q, heads_kv) == expected


def test_shardy_rules():
    assert _partitioning._shardy_rule("attention_fwd", 8, 2) == dict(
        sharding_rule="b sq (hk g) d, b sk hk d, b sk hk d -> b sq (hk g) d, b (hk g) sq", g=4)
    assert _partitioning._shardy_rule("attention_bwd", 4, 4) == dict(
        sharding_rule="b sq hk d, b sq hk d, b sk hk d, b sk hk d, b sq hk d, b hk sq -> b sq hk d, b sk hk d, "
                      "b sk hk d")
    assert _partitioning._shardy_rule("attention_fwd", 4, 1)["sharding_rule"].startswith("b sq h d, b sk hk d")
    # Token-mask operands: lengths [batch], query ones [batch, seq_q], key/value ones [batch, seq_k].
    tokens = ("kv_lengths", "q_segment_ids", "kv_segment_ids")
    assert _partitioning._shardy_rule("attention_fwd", 2, 2, tokens) == dict(
        sharding_rule="b sq hk d, b sk hk d, b sk hk d, b, b sq, b sk -> b sq hk d, b hk sq")


def test_zigzag_permutation():
    order = jax_flash.zigzag_permutation(16, 4)
    chunks = order.reshape(8, 2)[:, 0] // 2  # the chunk index of each half-shard, in device order
    np.testing.assert_array_equal(chunks, [0, 7, 1, 6, 2, 5, 3, 4])
    np.testing.assert_array_equal(np.sort(order), np.arange(16))
    with pytest.raises(ValueError, match="multiple of 2 \\* num_shards"):
        jax_flash.zigzag_permutation(12, 4)


def test_ring_attention_argument_errors():
    q = np.zeros((1, 6, 2, 8), np.float32)
    with pytest.raises(ValueError, match="same even length"):
        jax_flash.ring_attention(q, q[:, :3], q[:, :3], axis_name="cp", is_causal=True)
    with pytest.raises(ValueError, match="ring_attention takes"):
        jax_flash.ring_attention(q[0], q[0], q[0], axis_name="cp")
    with pytest.raises(ValueError, match=r"segment_ids must have shape \[batch, seq\] = \[1, 6\]"):
        jax_flash.ring_attention(q, q, q, axis_name="cp", segment_ids=np.zeros((1, 5), np.int32))
    with pytest.raises(TypeError, match="segment_ids must have dtype int32"):
        jax_flash.ring_attention(q, q, q, axis_name="cp", segment_ids=np.zeros((1, 6), np.int64))


def test_ring_merge_of_rows_without_keys():
    """Merging partial results: a row no key has reached (lse -inf, out 0) adds nothing, and two such rows give 0."""
    from jax_flash.ring import _merge

    out = np.zeros((1, 2, 1, 3), np.float32)  # [batch, seq, heads, head_dim]; row 0 saw keys, row 1 none so far
    out[0, 0] = 1.0
    lse = np.array([[[0.5, -np.inf]]], np.float32)  # [batch, heads, seq]
    no_keys = (np.zeros_like(out), np.full_like(lse, -np.inf))
    merged_out, merged_lse = _merge(out, lse, *no_keys)
    np.testing.assert_array_equal(merged_out, out)
    np.testing.assert_array_equal(merged_lse, lse)
    block = (np.full_like(out, 2.0), np.zeros_like(lse))  # lse 0 on both rows
    merged_out, merged_lse = _merge(out, lse, *block)
    weight = np.exp(0.5) / (np.exp(0.5) + 1.0)  # the first row's share of the softmax mass
    np.testing.assert_allclose(merged_out[0, 0], weight * 1.0 + (1 - weight) * 2.0, rtol=1e-6)
    np.testing.assert_allclose(merged_out[0, 1], 2.0, rtol=1e-6)
    np.testing.assert_allclose(merged_lse, [[[np.logaddexp(0.5, 0.0), 0.0]]], rtol=1e-6)


_GUIDE = Path(__file__).resolve().parent.parent / "docs" / "sharding.md"


@pytest.mark.skipif(not _GUIDE.exists(), reason="docs/sharding.md is not beside the tests (installed test run)")
def test_sharding_guide_snippets_run():
    """Each python block of docs/sharding.md runs as written, in its own process (the blocks set up fake devices)."""
    text = _GUIDE.read_text()
    snippets = [block.split("```", 1)[0] for block in text.split("```python\n")[1:]]
    assert len(snippets) >= 2
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    for snippet in snippets:
        done = subprocess.run([sys.executable, "-c", snippet], env=env, capture_output=True, text=True, timeout=600,
                              cwd=Path(__file__).parent)
        assert done.returncode == 0, f"guide snippet failed:\n{snippet}\n{done.stderr[-3000:]}"
