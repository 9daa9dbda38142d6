"""How decode and the KV-cache update run on sharded arrays: each device works on its own sequences and kv heads.

Both primitives lower to a `custom_partitioning` call around their FFI kernel, as the attention primitives do
(_partitioning.py), so under jit on a mesh XLA keeps the cache's shardings and runs the kernel on the local blocks:
a cache split by kv heads (tensor parallelism) or by sequences (data parallelism) is never gathered.

* Heads: the cache's kv-head axis may be split over mesh axes whose sizes multiply to a divisor of kv_heads; the
  query heads follow with their groups (query head h reads kv head h // group). Without a split of the cache's heads,
  the query's head axes decide, as for attention (with one kv head, MQA, every device then reads the whole cache).
* Batch, contiguous cache [batch, max_len, kv_heads, head_dim]: split with the sequences. Each device's kernel reads
  its own rows through a page table made for its local batch.
* Batch, paged pool [num_pages, page_size, kv_heads, head_dim]: any sequence may use any page, so the pool's page
  axis is replicated. Decode splits the query, lengths and page table along the batch; the update, which must write
  every sequence's rows into every copy of the pool, takes them whole.

The cache's length / page-size axis, the query's q_len and the head_dim are replicated (gathered if they arrive
split). Inside shard_map (every mesh axis manual) custom_partitioning calls the kernel on the local shapes.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jax_flash._partitioning import axis_names, head_axes, mesh_and_spec, query_head_factors, spec_entry


def identity_page_table(batch: int):
    """The page table that makes a contiguous cache [batch, max_len, ...] a pool of one page per sequence: a constant
    in the program, so no kernel computes it."""
    return jnp.asarray(np.arange(batch, dtype=np.int32)[:, None])


def _local_identity_page_table(batch: int):
    """identity_page_table for the sequences of one device where a mesh splits the batch. An iota, not a constant
    array: custom_partitioning takes no function that closes over constants."""
    return jax.lax.broadcasted_iota(jnp.int32, (batch, 1), 0)


def _with_local_page_table(kernel, table_index: int):
    """`kernel` with its page table operand replaced by the identity of its own (local) sequences."""

    def local(*args):
        args = list(args)
        args[table_index] = _local_identity_page_table(args[table_index].shape[0])
        return kernel(*args)

    return local


@functools.lru_cache(maxsize=None)
def partitioned_decode(call, heads_q: int, heads_kv: int, contiguous: bool):
    """`call(q, k, v, lengths, page_table, config)` -> (out, lse), with its sharding rules. `call` is part of the
    cache key: one function object per platform."""

    def kernel(config, q, k, v, lengths, page_table):
        return call(q, k, v, lengths, page_table, config)

    def shardings(arg_shapes):
        q, k = arg_shapes[:2]
        mesh, q_spec = mesh_and_spec(q, "decode", "query")
        k_spec = mesh_and_spec(k, "decode", "key cache")[1]
        batch = (k_spec[0] or q_spec[0]) if contiguous else q_spec[0]
        # The cache's head split if it has one, else the query's; never an axis the batch already uses.
        requested = [a for a in axis_names(k_spec[2]) or axis_names(q_spec[2]) if a not in axis_names(batch)]
        q_heads, kv_heads = head_axes(mesh, tuple(requested), heads_q, heads_kv)
        q_spec = P(batch, None, spec_entry(q_heads), None)
        cache = P(batch if contiguous else None, None, spec_entry(kv_heads), None)
        operands = (q_spec, cache, cache, P(batch), P(batch, None))
        results = (q_spec, P(batch, spec_entry(q_heads), None))
        return mesh, operands, results, contiguous and batch is not None

    heads, sizes = query_head_factors(heads_q, heads_kv)
    cache = "b l hk d" if contiguous else "n p hk d"
    return _partitioned(
        kernel, shardings, table_index=4, static_argnums=(0,),
        # In order of first appearance in the rule: Shardy rejects special factors listed out of order.
        need_replication_factors=("s", "d", "l", "t") if contiguous else ("s", "d", "n", "p", "t"),
        sharding_rule=f"b s {heads} d, {cache}, {cache}, b, b t -> b s {heads} d, b {heads} s", **sizes)


@functools.lru_cache(maxsize=None)
def partitioned_update(call, heads_kv: int, contiguous: bool):
    """`call(k, v, new_k, new_v, positions, page_table)` -> (k, v), with its sharding rules."""

    def kernel(k, v, new_k, new_v, positions, page_table):  # a plain function: custom_partitioning takes no partial
        return call(k, v, new_k, new_v, positions, page_table)

    def shardings(arg_shapes):
        mesh, k_spec = mesh_and_spec(arg_shapes[0], "the KV-cache update", "key cache")
        kv_heads = spec_entry(head_axes(mesh, axis_names(k_spec[2]), heads_kv, heads_kv)[1])
        batch = k_spec[0] if contiguous else None
        rows = P(batch, None, kv_heads, None)  # the caches, and the new keys and values alike
        return mesh, (rows, rows, rows, rows, P(batch), P(batch, None)), (rows, rows), batch is not None

    if contiguous:
        rule = "b l hk d, b l hk d, b t hk d, b t hk d, b, b m -> b l hk d, b l hk d"
        replicated = ("l", "d", "t", "m")
    else:
        rule = "n p hk d, n p hk d, b t hk d, b t hk d, b, b m -> n p hk d, n p hk d"
        replicated = ("n", "p", "d", "b", "t", "m")
    return _partitioned(kernel, shardings, table_index=5, need_replication_factors=replicated, sharding_rule=rule)


def _partitioned(kernel, shardings, *, table_index: int, static_argnums=(), **rule):
    """`kernel` under custom_partitioning. shardings(arg_shapes) gives (mesh, operand specs, result specs, whether
    the mesh splits a contiguous cache's batch, so that each device needs the page table of its own sequences in
    place of operand `table_index`); `rule` is the Shardy rule and its factors."""

    def partition(*args):  # (static arguments..., mesh, arg_shapes, result_shape)
        mesh, operands, results, local_table = shardings(args[-2])
        local = functools.partial(kernel, *args[:-3])
        if local_table:
            local = _with_local_page_table(local, table_index)
        return mesh, local, _named(mesh, results), _named(mesh, operands)

    def infer_sharding_from_operands(*args):  # the same arguments
        mesh, _, results, _ = shardings(args[-2])
        return _named(mesh, results)

    partitioned = custom_partitioning(kernel, static_argnums=static_argnums)
    partitioned.def_partition(partition=partition, infer_sharding_from_operands=infer_sharding_from_operands,
                              **rule)
    return partitioned


def _named(mesh, specs) -> tuple:
    return tuple(NamedSharding(mesh, spec) for spec in specs)
