"""The private JAX hooks that sharding support cannot do without, kept in this one module.

Written against jax 0.10 and 0.11. Each hook is looked up when this module is imported, so a JAX release that moves
one fails here, with a message naming it, instead of somewhere deep inside a jit.
"""

from __future__ import annotations

import jax
from jax._src import core as _core
from jax._src import dispatch as _dispatch

_FIRST_SUPPORTED = (0, 10)

if jax.__version_info__[:2] < _FIRST_SUPPORTED:
    raise ImportError(f"jax_flash needs jax >= {'.'.join(map(str, _FIRST_SUPPORTED))}, found {jax.__version__}")


def _hook(module, name: str):
    try:
        return getattr(module, name)
    except AttributeError as error:
        raise ImportError(f"jax {jax.__version__} has no {module.__name__}.{name}, which jax_flash's sharding support "
                          f"uses (written for jax 0.10-0.11); please report this") from error


_devices_during_lowering = _hook(_dispatch, "prim_requires_devices_during_lowering")
_insert_pcasts = _hook(_core, "auto_insert_reshard")


def require_devices_during_lowering(*primitives) -> None:
    """jit gives a lowering rule the mesh and its devices only when the program holds a primitive from this set.

    custom_partitioning, which the attention primitives lower to, needs them to call its partitioner; JAX's own
    cuDNN attention primitives register themselves the same way.
    """
    _devices_during_lowering.update(primitives)


def match_varying_axes(*arrays):
    """Inside shard_map, casts each array to vary over every manual axis that any of them varies over.

    JAX does this for its own primitives. The cast of an operand that is replicated over an axis (K/V of MQA under
    tensor parallelism) transposes to a sum over that axis, so its gradient adds up the shards' contributions.
    Outside shard_map it returns the arrays unchanged.
    """
    return tuple(_insert_pcasts(*arrays))
