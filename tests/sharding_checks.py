"""Multi-device checks of jax_flash's sharding support, run by test_sharding.py in a fresh process.

Eight CPU devices need --xla_force_host_platform_device_count=8 before JAX starts, which the pytest process (where
JAX is long initialised) cannot give. Usage: python sharding_checks.py {jit|shard_map|tokens|decode|ring}; prints one JSON line, a
list of results, each with the largest relative error of every output against the same computation unsharded on
one device, and what the compiled program holds.
"""

from __future__ import annotations

import functools
import json
import os
import sys

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jax_flash  # noqa: E402

BATCH, SEQ_Q, SEQ_K, HEAD_DIM = 4, 24, 40, 32
OUTPUTS = ("out", "dq", "dk", "dv")


def _mesh(shape, names, axis_type=AxisType.Auto):
    return jax.make_mesh(shape, names, axis_types=(axis_type,) * len(shape))


def _inputs(seed, heads_q, heads_kv, seq_q=SEQ_Q, seq_k=SEQ_K):
    """q, k, v and the output cotangent, float32 numpy arrays."""
    rng = np.random.default_rng(seed)
    shapes = [(BATCH, seq_q, heads_q, HEAD_DIM), (BATCH, seq_k, heads_kv, HEAD_DIM),
              (BATCH, seq_k, heads_kv, HEAD_DIM), (BATCH, seq_q, heads_q, HEAD_DIM)]
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def _forward_and_gradients(attention):
    """(q, k, v, cotangent) -> (out, dq, dk, dv): forward and backward in one program."""

    def run(q, k, v, cotangent):
        out, vjp = jax.vjp(attention, q, k, v)
        return (out, *vjp(cotangent))

    return run


def _unsharded(is_causal, inputs):
    attention = functools.partial(jax_flash.dot_product_attention, is_causal=is_causal)
    return jax.jit(_forward_and_gradients(attention))(*inputs)


def _result(name, got, want, compiled, outputs=OUTPUTS, kernels=("jax_flash_attention_",)):
    """What a check reports: each output's largest error relative to its largest |value|, and what the compiled
    program holds (its collectives, and how many calls of the FFI targets whose names start with `kernels`)."""
    hlo = compiled.as_text()
    return {
        "check": name,
        "devices": len(compiled.input_shardings[0][0].device_set),
        "errors": {k: float(np.max(np.abs(np.asarray(g) - np.asarray(w))) / np.max(np.abs(np.asarray(w))))
                   for k, g, w in zip(outputs, got, want)},
        "all_gather": "all-gather" in hlo,
        "collective_permute": "collective-permute" in hlo,
        "kernel_calls": sum(hlo.count(kernel) for kernel in kernels),
    }


def _put(mesh, inputs, specs):
    return [jax.device_put(x, NamedSharding(mesh, s)) for x, s in zip(inputs, specs)]


def jit_check(name, *, heads_q, heads_kv, q_spec, kv_spec, is_causal=False, axis_type=AxisType.Auto):
    """jax.jit on NamedSharding inputs; also records the output's sharding, which must stay the query's."""
    mesh = _mesh((4, 2), ("dp", "tp"), axis_type)
    inputs = _inputs(len(name), heads_q, heads_kv)
    sharded = _put(mesh, inputs, (q_spec, kv_spec, kv_spec, q_spec))
    step = jax.jit(_forward_and_gradients(functools.partial(jax_flash.dot_product_attention, is_causal=is_causal)))
    got = step(*sharded)
    result = _result(name, got, _unsharded(is_causal, inputs), step.lower(*sharded).compile())
    result["out_sharding_kept"] = got[0].sharding.is_equivalent_to(NamedSharding(mesh, q_spec), 4)
    return result


def shard_map_check(name, *, heads_q, heads_kv, q_spec, kv_spec, is_causal=False):
    """dot_product_attention called per shard inside jax.shard_map (the kernel sees the local shapes)."""
    mesh = _mesh((4, 2), ("dp", "tp"))
    inputs = _inputs(len(name), heads_q, heads_kv)
    attention = jax.shard_map(functools.partial(jax_flash.dot_product_attention, is_causal=is_causal), mesh=mesh,
                              in_specs=(q_spec, kv_spec, kv_spec), out_specs=q_spec)
    step = jax.jit(_forward_and_gradients(attention))
    sharded = _put(mesh, inputs, (q_spec, kv_spec, kv_spec, q_spec))
    return _result(name, step(*sharded), _unsharded(is_causal, inputs), step.lower(*sharded).compile())


def ring_check(name, *, mesh_shape, is_causal, heads_q=4, heads_kv=2, seq=64, seq_k=None, documents=False,
               window=None):
    """ring_attention over the 'cp' axis (with batch over 'dp' on a 2-D mesh), zig-zag layout when causal; with
    documents, each row packs 5 documents of random lengths (segment ids permuted and sharded like the sequence);
    window: local_window_size over the whole sequence; seq_k: another key length (non-causal)."""
    names = ("dp", "cp")[-len(mesh_shape):]
    mesh = _mesh(mesh_shape, names)
    spec = P("dp" if "dp" in names else None, "cp")
    seq_k = seq_k or seq
    inputs = _inputs(len(name), heads_q, heads_kv, seq, seq_k)
    order = jax_flash.zigzag_permutation(seq, mesh.shape["cp"]) if is_causal else np.arange(seq)
    ids = None
    if documents:
        cuts = np.random.default_rng(len(name)).integers(0, seq, (BATCH, 4))
        ids = (np.arange(seq)[None, :, None] >= cuts[:, None, :]).sum(-1).astype(np.int32)  # [batch, seq]
    ring = functools.partial(jax_flash.ring_attention, axis_name="cp", is_causal=is_causal, local_window_size=window)
    attention = jax.shard_map(lambda q, k, v, *ids: ring(q, k, v, segment_ids=ids[0] if ids else None), mesh=mesh,
                              in_specs=spec, out_specs=spec)
    extra = () if ids is None else (jax.device_put(ids[:, order], NamedSharding(mesh, spec)),)
    step = jax.jit(lambda q, k, v, cotangent, *ids: _forward_and_gradients(
        lambda q, k, v: attention(q, k, v, *ids))(q, k, v, cotangent))
    key_order = order if seq_k == seq else np.arange(seq_k)
    sharded = _put(mesh, [x[:, o] for x, o in zip(inputs, (order, key_order, key_order, order))], (spec,) * 4)
    got = [np.asarray(x)[:, np.argsort(o)] for x, o in zip(step(*sharded, *extra), (order, order, key_order, key_order))]
    full = functools.partial(jax_flash.dot_product_attention, is_causal=is_causal, segment_ids=ids,
                             local_window_size=window)
    want = jax.jit(_forward_and_gradients(full))(*inputs)
    return _result(name, got, want, step.lower(*sharded, *extra).compile())


def _token_inputs(seed):
    """Query and key/value segment ids (3 documents at random cuts per row) and key/value lengths, int32."""
    rng = np.random.default_rng(seed)
    q_ids, kv_ids = (np.sort(rng.integers(0, 3, (BATCH, seq)), axis=1).astype(np.int32) for seq in (SEQ_Q, SEQ_K))
    return [q_ids, kv_ids, rng.integers(1, SEQ_K + 1, BATCH).astype(np.int32)]


def _with_tokens(attention):
    """(q, k, v, cotangent, q_ids, kv_ids, kv_lengths) -> (out, dq, dk, dv) with segment ids and lengths."""

    def run(q, k, v, cotangent, q_ids, kv_ids, kv_lengths):
        masked = functools.partial(attention, segment_ids=(q_ids, kv_ids), key_value_seq_lengths=kv_lengths)
        return _forward_and_gradients(masked)(q, k, v, cotangent)

    return run


def tokens_check(name, *, shard_map=False):
    """Segment ids and lengths sharded along the batch with q/k/v (batch x heads), under jit or inside shard_map."""
    mesh = _mesh((4, 2), ("dp", "tp"))
    spec, token_spec = P("dp", None, "tp"), P("dp")
    inputs = _inputs(len(name), 4, 2) + _token_inputs(len(name))
    attention = functools.partial(jax_flash.dot_product_attention, is_causal=True)
    step = _with_tokens(attention)
    if shard_map:
        per_shard = jax.shard_map(
            lambda q, k, v, q_ids, kv_ids, kv_lengths: attention(q, k, v, segment_ids=(q_ids, kv_ids),
                                                                 key_value_seq_lengths=kv_lengths),
            mesh=mesh, in_specs=(spec,) * 3 + (token_spec,) * 3, out_specs=spec)

        def step(q, k, v, cotangent, *tokens):
            return _forward_and_gradients(lambda q, k, v: per_shard(q, k, v, *tokens))(q, k, v, cotangent)
    step = jax.jit(step)
    sharded = _put(mesh, inputs, (spec,) * 4 + (token_spec,) * 3)
    want = jax.jit(_with_tokens(attention))(*inputs)
    return _result(name, step(*sharded), want, step.lower(*sharded).compile())


# Decode: GQA 8/2 over a cache of 48 positions; one new token per sequence is written, then attended.
DECODE_HEADS_Q, DECODE_HEADS_KV, DECODE_LEN, PAGE_SIZE = 8, 2, 48, 16


def _decode_inputs(seed, heads_q=DECODE_HEADS_Q, heads_kv=DECODE_HEADS_KV):
    """q [batch, 1, heads_q, d], caches [batch, len, heads_kv, d], new rows [batch, 1, heads_kv, d] and the
    positions they go to (lengths - 1), float32 / int32 numpy arrays."""
    rng = np.random.default_rng(seed)
    cache = (BATCH, DECODE_LEN, heads_kv, HEAD_DIM)
    q = rng.standard_normal((BATCH, 1, heads_q, HEAD_DIM)).astype(np.float32)
    k, v = (rng.standard_normal(cache).astype(np.float32) for _ in range(2))
    new_k, new_v = (rng.standard_normal((BATCH, 1, heads_kv, HEAD_DIM)).astype(np.float32) for _ in range(2))
    lengths = rng.integers(1, DECODE_LEN + 1, BATCH).astype(np.int32)
    return [q, k, v, new_k, new_v, lengths - 1, lengths]


def _paged(k, v):
    """The contiguous caches as page pools in a shuffled page order, and the page table that reads them back."""
    pages_per_seq = DECODE_LEN // PAGE_SIZE
    order = np.random.default_rng(0).permutation(BATCH * pages_per_seq)
    pools = [x.reshape(BATCH * pages_per_seq, PAGE_SIZE, *x.shape[2:])[np.argsort(order)] for x in (k, v)]
    return pools, order.reshape(BATCH, pages_per_seq).astype(np.int32)


def _decode_step(page_table=None):
    """(q, k, v, new_k, new_v, positions, lengths) -> (out, lse, k, v): the update, then decode on the new cache."""
    paged = {} if page_table is None else {"page_table": page_table}

    def step(q, k, v, new_k, new_v, positions, lengths):
        k, v = jax_flash.update_kv_cache(k, v, new_k, new_v, positions, **paged)
        out, lse = jax_flash.decode_attention(q, k, v, lengths, return_lse=True, **paged)
        return out, lse, k, v

    return step


def decode_check(name, *, q_spec, cache_spec, paged=False, heads_q=DECODE_HEADS_Q, heads_kv=DECODE_HEADS_KV,
                 shard_map=False):
    """The cache update and decode under jit on NamedSharding inputs, the caches donated, against one device; or,
    with shard_map, the step called per shard (the kernels see the local shapes)."""
    mesh = _mesh((4, 2), ("dp", "tp"))
    q, k, v, new_k, new_v, positions, lengths = _decode_inputs(len(name), heads_q, heads_kv)
    table = None
    if paged:
        (k, v), table = _paged(k, v)
    want = jax.jit(_decode_step(table))(q, k, v, new_k, new_v, positions, lengths)
    row_spec = P(q_spec[0] if len(q_spec) else None)
    specs = (q_spec, cache_spec, cache_spec, P(*cache_spec[:1], None, *cache_spec[2:3]),
             P(*cache_spec[:1], None, *cache_spec[2:3]), row_spec, row_spec)
    sharded = _put(mesh, [q, k, v, new_k, new_v, positions, lengths], specs)
    step = _decode_step(table)
    if shard_map:
        step = jax.shard_map(step, mesh=mesh, in_specs=specs, out_specs=(q_spec, P(*q_spec[:1], *q_spec[2:3]),
                                                                         cache_spec, cache_spec))
    step = jax.jit(step, donate_argnums=(1, 2))
    compiled = step.lower(*sharded).compile()
    got = step(*sharded)
    result = _result(name, got, want, compiled, outputs=("out", "lse", "k", "v"),
                     kernels=("jax_flash_decode", "jax_flash_kv_cache_update"))
    result["cache_sharding_kept"] = got[2].sharding.is_equivalent_to(NamedSharding(mesh, cache_spec), 4)
    return result


def _gspmd(check, **kwargs):
    """The check under the GSPMD partitioner (jax_use_shardy_partitioner=False), which uses the callbacks."""
    jax.config.update("jax_use_shardy_partitioner", False)
    try:
        return check(**kwargs)
    finally:
        jax.config.update("jax_use_shardy_partitioner", True)


GQA = dict(heads_q=4, heads_kv=2)
BATCH_X_HEADS = dict(q_spec=P("dp", None, "tp"), kv_spec=P("dp", None, "tp"))

GROUPS = {
    "jit": lambda: [
        jit_check("batch", **GQA, q_spec=P("dp"), kv_spec=P("dp")),
        jit_check("heads", **GQA, q_spec=P(None, None, "tp"), kv_spec=P(None, None, "tp"), is_causal=True),
        jit_check("batch_x_heads", **GQA, **BATCH_X_HEADS, is_causal=True),
        jit_check("batch_x_heads_explicit_mesh", **GQA, **BATCH_X_HEADS, axis_type=AxisType.Explicit),
        _gspmd(jit_check, name="batch_x_heads_gspmd", **GQA, **BATCH_X_HEADS, is_causal=True),
        # Query heads split further than kv heads: the second axis splits each kv head's query group.
        jit_check("gqa_group_split", heads_q=8, heads_kv=2, q_spec=P(None, None, ("tp", "dp")),
                  kv_spec=P(None, None, "tp")),
        jit_check("mqa_kv_replicated", heads_q=4, heads_kv=1, q_spec=P("dp", None, "tp"), kv_spec=P("dp")),
    ],
    "shard_map": lambda: [
        shard_map_check("batch_x_heads", **GQA, **BATCH_X_HEADS, is_causal=True),
        # K/V replicated over 'tp' while the query heads are split: their gradients must be summed over 'tp'.
        shard_map_check("mqa_kv_replicated", heads_q=4, heads_kv=1, q_spec=P("dp", None, "tp"), kv_spec=P("dp")),
    ],
    "tokens": lambda: [
        tokens_check("batch_x_heads_tokens"),
        _gspmd(tokens_check, name="batch_x_heads_tokens_gspmd"),
        tokens_check("shard_map_tokens", shard_map=True),
    ],
    "decode": lambda: [
        decode_check("decode_batch_x_heads", q_spec=P("dp", None, "tp"), cache_spec=P("dp", None, "tp")),
        decode_check("decode_heads_query_replicated", q_spec=P(), cache_spec=P(None, None, "tp")),
        _gspmd(decode_check, name="decode_batch_x_heads_gspmd", q_spec=P("dp", None, "tp"),
               cache_spec=P("dp", None, "tp")),
        decode_check("decode_mqa", q_spec=P("dp", None, "tp"), cache_spec=P("dp"), heads_kv=1),
        # A page pool is shared by the batch: its pages stay whole on every device, split by kv heads only.
        decode_check("decode_paged_heads", q_spec=P("dp", None, "tp"), cache_spec=P(None, None, "tp"), paged=True),
        decode_check("decode_shard_map", q_spec=P("dp", None, "tp"), cache_spec=P("dp", None, "tp"), shard_map=True),
        # The cache's batch and the query's heads on one axis: the batch keeps it, the heads are not split.
        decode_check("decode_axis_conflict", q_spec=P(None, None, "dp"), cache_spec=P("dp")),
    ],
    "ring": lambda: [
        ring_check("ring", mesh_shape=(8,), is_causal=False),
        ring_check("ring_causal", mesh_shape=(8,), is_causal=True),
        ring_check("ring_causal_batch_x_sequence", mesh_shape=(2, 4), is_causal=True, heads_q=2, heads_kv=2),
        ring_check("ring_causal_documents", mesh_shape=(2, 4), is_causal=True, documents=True),
        ring_check("ring_documents", mesh_shape=(8,), is_causal=False, documents=True),
        # Windows that reach one, two and no neighbouring block (8 tokens per device; causal: two chunks of 4).
        ring_check("ring_causal_window", mesh_shape=(8,), is_causal=True, window=5),
        ring_check("ring_window", mesh_shape=(2, 4), is_causal=False, window=(3, 20)),
        ring_check("ring_window_longer_keys", mesh_shape=(8,), is_causal=False, seq=64, seq_k=96, window=(6, 2)),
        ring_check("ring_causal_window_documents", mesh_shape=(2, 4), is_causal=True, window=(9, 0), documents=True),
    ],
}

if __name__ == "__main__":
    print(json.dumps(GROUPS[sys.argv[1]]()))
