"""Trace-time checks of the public arguments, each error naming the argument and what is allowed."""

from __future__ import annotations

import math
import operator

import jax
import jax.numpy as jnp

from jax_flash._primitives import MAX_HEAD_DIM

SUPPORTED_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))


def dtype_names(dtypes) -> str:
    """'float32, float16 and bfloat16'."""
    names = [jnp.dtype(d).name for d in dtypes]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def check_dtype(name: str, x, dtypes=SUPPORTED_DTYPES) -> None:
    """x's dtype is one of `dtypes`."""
    if jnp.dtype(x.dtype) not in dtypes:
        raise TypeError(f"{name} has dtype {x.dtype}; supported dtypes are {dtype_names(dtypes)}")


def check_qkv(query, key, value, dtypes=SUPPORTED_DTYPES) -> None:
    """Shapes [B, S, H, D] (or [S, H, D] for all three) and dtypes (one of `dtypes`) of query, key and value."""
    for name, x in (("query", query), ("key", key), ("value", value)):
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            raise TypeError(f"{name} must be an array, got {type(x).__name__}")
        if x.ndim not in (3, 4):
            raise ValueError(f"{name} must have rank 4 [batch, seq, heads, head_dim] or rank 3 [seq, heads, "
                             f"head_dim], got shape {x.shape}")
        check_dtype(name, x, dtypes)
        if 0 in x.shape:
            raise ValueError(f"{name} has a zero-length axis: shape {x.shape}")
    if not query.ndim == key.ndim == value.ndim:
        raise ValueError(f"query, key and value must have the same rank, got shapes {query.shape}, {key.shape} "
                         f"and {value.shape}")
    if not query.dtype == key.dtype == value.dtype:
        raise TypeError(f"query, key and value must have the same dtype, got {query.dtype}, {key.dtype} and "
                        f"{value.dtype}")
    if key.shape != value.shape:
        raise ValueError(f"key and value must have the same shape, got {key.shape} and {value.shape}")
    if query.shape[-1] != key.shape[-1]:
        raise ValueError(f"query and key must have the same head_dim (last axis), got {query.shape[-1]} and "
                         f"{key.shape[-1]}")
    if query.shape[-1] > MAX_HEAD_DIM:
        raise ValueError(f"head_dim must be at most {MAX_HEAD_DIM}, got {query.shape[-1]}")
    if query.ndim == 4 and query.shape[0] != key.shape[0]:
        raise ValueError(f"query and key must have the same batch size, got {query.shape[0]} and {key.shape[0]}")
    heads_q, heads_kv = query.shape[-2], key.shape[-2]
    if heads_q % heads_kv:
        raise ValueError(f"the number of query heads ({heads_q}) must be a multiple of the number of key/value heads "
                         f"({heads_kv})")


def concrete_float(name: str, value) -> float:
    """A Python float from a static argument; traced values are rejected because they pick the compiled kernel."""
    if isinstance(value, jax.core.Tracer):
        raise TypeError(f"{name} must be a concrete Python number, not a traced value: kernels take it as a "
                        f"compile-time constant (pass it as a static argument under jit)")
    try:
        return float(value)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{name} must be a number, got {value!r}") from e


def window_bounds(local_window_size, is_causal: bool) -> tuple[int, int]:
    """(window_left, window_right) with -1 for unbounded, from jax.nn's local_window_size and is_causal."""
    left = right = -1
    if local_window_size is not None:
        bounds = local_window_size if isinstance(local_window_size, tuple) else (local_window_size,) * 2
        # operator.index accepts Python and NumPy integers alike; bools are integers to Python but not window sizes.
        try:
            if len(bounds) != 2 or any(isinstance(w, bool) for w in bounds):
                raise TypeError
            left, right = (operator.index(w) for w in bounds)
        except TypeError:
            raise TypeError(f"local_window_size must be an int or a (left, right) tuple of ints, got "
                            f"{local_window_size!r}") from None
        if left < 0 or right < 0:
            raise ValueError(f"local_window_size must be non-negative, got {local_window_size!r}")
    if is_causal:
        right = 0
    return left, right


def scale_and_softcap(head_dim: int, scale, softcap) -> tuple[float, float]:
    """The softmax scale (default 1/sqrt(head_dim)) and soft-cap (0 = off) as concrete floats."""
    scale = 1.0 / math.sqrt(head_dim) if scale is None else concrete_float("scale", scale)
    softcap = 0.0 if softcap is None else concrete_float("softcap", softcap)
    if softcap < 0:
        raise ValueError(f"softcap must be positive, or None/0 for no capping, got {softcap}")
    return scale, softcap
