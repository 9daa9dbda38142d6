"""How the attention kernels run on sharded arrays: each device calls the kernel on its own batch and head slice.

The attention primitives lower to a `custom_partitioning` call around the FFI kernel, so under jit on a mesh XLA
keeps the batch and head shardings of q/k/v and runs the kernel on the local blocks with no communication. The
sequence and head_dim axes are replicated first (sequence sharding is ring attention's job, jax_flash.ring_attention).

Grouped-query attention: query head h reads kv head h // group, so the query head axis is the compound factor
(kv_heads, group), kv_heads major. A sharding of it splits kv_heads first, and splits group only once every kv head
has devices of its own; each device then holds whole kv heads and exactly the query heads that read them, and the
backward sums each kv head's dk/dv over the devices that split its group.

Inside shard_map (every mesh axis manual) custom_partitioning calls the kernel directly on the local shapes.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning
from jax.interpreters import mlir
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jax_flash._config import TOKEN_INPUTS, AttentionConfig

# The layout of each operand and result, by role: "q" [batch, seq_q, heads_q, head_dim] (also out and its
# cotangent), "kv" [batch, seq_k, heads_kv, head_dim], "lse" [batch, heads_q, seq_q], "descale" the FP8 forward's
# [2] scales (replicated); the token-mask operands that follow are "len" [batch], "q_tok" [batch, seq_q] and
# "kv_tok" [batch, seq_k], sharded along the batch only.
_ROLES = {
    "attention_fwd": (("q", "kv", "kv"), ("q", "lse")),
    "attention_bwd": (("q", "q", "kv", "kv", "q", "lse"), ("q", "kv", "kv")),
    "attention_fp8_fwd": (("q", "kv", "kv", "descale"), ("q", "lse")),
}
_TOKEN_ROLES = {"q_lengths": "len", "kv_lengths": "len", "q_segment_ids": "q_tok", "kv_segment_ids": "kv_tok",
                "q_positions": "q_tok", "kv_positions": "kv_tok"}
# Which operand is the query, whose sharding the partitioner follows.
_QUERY_OPERAND = {"attention_fwd": 0, "attention_bwd": 1, "attention_fp8_fwd": 0}


def lower(ctx, operands, *, op: str, target: str, config: AttentionConfig):
    """The MLIR of the primitive `op`: its FFI kernel `target` wrapped in custom_partitioning."""
    query = ctx.avals_in[_QUERY_OPERAND[op]]
    key = ctx.avals_in[_QUERY_OPERAND[op] + 1]
    kernel = _partitioned_kernel(op, target, query.shape[2], key.shape[2], config.token_inputs)
    return mlir.lower_fun(lambda *args: kernel(config, *args), multiple_results=True)(ctx, *operands)


def _result_shapes(op: str, operands):
    if op in ("attention_fwd", "attention_fp8_fwd"):
        q = operands[0]
        batch, seq_q, heads_q, _ = q.shape
        out_dtype = jnp.bfloat16 if op == "attention_fp8_fwd" else q.dtype
        return (jax.ShapeDtypeStruct(q.shape, out_dtype),
                jax.ShapeDtypeStruct((batch, heads_q, seq_q), jnp.float32))
    return tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in operands[1:4])


def _roles(op: str, token_inputs: tuple = ()) -> tuple[tuple, tuple]:
    """(operand roles, result roles) of `op` called with the token-mask operands `token_inputs`."""
    operands, results = _ROLES[op]
    return operands + tuple(_TOKEN_ROLES[name] for name in token_inputs), results


@functools.lru_cache(maxsize=None)
def _partitioned_kernel(op: str, target: str, heads_q: int, heads_kv: int, token_inputs: tuple):
    """The kernel call with its sharding rules; one per (op, platform target, head counts, token-mask operands)."""
    attention_operands = len(_ROLES[op][0])

    def kernel(config, *operands):
        # The FFI target takes every token-mask operand; absent ones are zero-size placeholders, made here (on each
        # device) so that they never need a sharding.
        given = dict(zip(token_inputs, operands[attention_operands:]))
        tokens = [given.get(name, jnp.zeros((0,), jnp.int32)) for name in TOKEN_INPUTS]
        operands = operands[:attention_operands]
        return jax.ffi.ffi_call(target, _result_shapes(op, operands))(*operands, *tokens,
                                                                      **config.ffi_attributes())

    def partition(config, mesh, arg_shapes, result_shape):
        del result_shape
        arg_shardings, result_shardings, group_axes = _shardings(op, arg_shapes, token_inputs)
        local = functools.partial(kernel, config)
        if op == "attention_bwd" and group_axes:
            local = functools.partial(_sum_kv_gradients, local, group_axes)
        return mesh, local, result_shardings, arg_shardings

    def infer_sharding_from_operands(config, mesh, arg_shapes, result_shape):
        del config, mesh, result_shape
        return _shardings(op, arg_shapes, token_inputs)[1]

    partitioned = custom_partitioning(kernel, static_argnums=(0,))
    partitioned.def_partition(
        partition=partition,
        infer_sharding_from_operands=infer_sharding_from_operands,
        # In order of first appearance in the rule: Shardy rejects special factors listed out of order.
        need_replication_factors=("sq", "d", "sk") + (("c",) if "descale" in _ROLES[op][0] else ()),
        **_shardy_rule(op, heads_q, heads_kv, token_inputs))
    return partitioned


def _shardy_rule(op: str, heads_q: int, heads_kv: int, token_inputs: tuple = ()) -> dict:
    """Einsum-like rule for Shardy, e.g. 'b sq (hk g) d, b sk hk d, b sk hk d -> b sq (hk g) d, b (hk g) sq'."""
    heads, sizes = query_head_factors(heads_q, heads_kv)
    layout = {"q": f"b sq {heads} d", "kv": "b sk hk d", "lse": f"b {heads} sq", "descale": "c", "len": "b",
              "q_tok": "b sq", "kv_tok": "b sk"}
    operands, results = _roles(op, token_inputs)
    rule = ", ".join(layout[r] for r in operands) + " -> " + ", ".join(layout[r] for r in results)
    return dict(sharding_rule=rule, **sizes)


def query_head_factors(heads_q: int, heads_kv: int) -> tuple[str, dict]:
    """The Shardy factors of the query head axis, beside "hk" for the kv heads: (factors, their sizes).

    (kv_heads, group), kv_heads major; Shardy allows no factor of size 1 in a compound, so without GQA the query heads
    are the kv heads' factor, and with a single kv head (MQA) a factor of their own.
    """
    group = heads_q // heads_kv
    if group == 1:
        return "hk", {}
    if heads_kv == 1:
        return "h", {}
    return "(hk g)", {"g": group}


def _sum_kv_gradients(kernel, group_axes, *operands):
    """Devices that split one kv head's query group each hold part of its dk and dv: add the parts up."""
    dq, dk, dv = kernel(*operands)
    return dq, jax.lax.psum(dk, group_axes), jax.lax.psum(dv, group_axes)


def _shardings(op: str, arg_shapes, token_inputs: tuple = ()):
    """(operand shardings, result shardings, group axes) from the query's batch and head shardings.

    Everything but the batch and head axes is replicated; XLA reshards any operand that arrives otherwise. The group
    axes are the mesh axes that split the query heads but not the kv heads.
    """
    query = arg_shapes[_QUERY_OPERAND[op]]
    heads_kv = arg_shapes[_QUERY_OPERAND[op] + 1].shape[2]
    mesh, spec = mesh_and_spec(query, "attention", "query")
    batch = spec[0]
    heads, kv_heads = head_axes(mesh, axis_names(spec[2]), query.shape[2], heads_kv)
    specs = {"q": P(batch, None, spec_entry(heads), None), "kv": P(batch, None, spec_entry(kv_heads), None),
             "lse": P(batch, spec_entry(heads), None), "descale": P(None), "len": P(batch), "q_tok": P(batch, None),
             "kv_tok": P(batch, None)}
    operands, results = _roles(op, token_inputs)
    return (tuple(NamedSharding(mesh, specs[r]) for r in operands),
            tuple(NamedSharding(mesh, specs[r]) for r in results), heads[len(kv_heads):])


def mesh_and_spec(arg_shape, op_name: str, operand_name: str):
    """(mesh, PartitionSpec entries padded to the operand's rank) of an operand's NamedSharding."""
    sharding = arg_shape.sharding
    if not isinstance(sharding, NamedSharding):
        # What custom_partitioning hands over without a mesh, e.g. inside a shard_map that leaves some axes automatic.
        raise NotImplementedError(
            f"jax_flash partitions {op_name} over the mesh of NamedShardings, and got the {operand_name} sharding "
            f"{sharding} without one. Give jit NamedSharding inputs; inside jax.shard_map, make every mesh axis "
            f"manual (the default axis_names)")
    return sharding.mesh, tuple(sharding.spec) + (None,) * (len(arg_shape.shape) - len(sharding.spec))


def head_axes(mesh, requested: tuple, heads_q: int, heads_kv: int) -> tuple[tuple, tuple]:
    """(query head axes, kv head axes): the longest prefix of the requested axes that keeps whole kv heads local.

    Leading axes split the kv heads, and their query groups with them, while their sizes multiply to a divisor of
    heads_kv; once every kv head has devices of its own, further axes split the query groups. Axes past that prefix
    are left off the head axis, so XLA gathers that part of it: slower, still right, and never an error, which a
    GSPMD callback must not raise.
    """
    q_axes, kv_axes, kv_shards, group_shards = [], [], 1, 1
    for axis in requested:
        size = mesh.shape[axis]
        if group_shards == 1 and heads_kv % (kv_shards * size) == 0:
            kv_axes.append(axis)
            kv_shards *= size
        elif kv_shards == heads_kv and (heads_q // heads_kv) % (group_shards * size) == 0:
            group_shards *= size
        else:
            break
        q_axes.append(axis)
    return tuple(q_axes), tuple(kv_axes)


def axis_names(entry) -> tuple:
    if entry is None or entry is P.UNCONSTRAINED:
        return ()
    return tuple(entry) if isinstance(entry, tuple) else (entry,)


def spec_entry(axes: tuple):
    """A PartitionSpec entry for `axes`: None, one axis name, or a tuple of names."""
    if not axes:
        return None
    return axes[0] if len(axes) == 1 else axes
