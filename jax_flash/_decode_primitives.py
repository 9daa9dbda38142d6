"""The decode and KV-cache-update primitives: abstract evaluation, lowering to the FFI targets, and batching.

Both see the cache as a page pool [num_pages, page_size, kv_heads, head_dim] with a page table [batch, pages_per_seq]
int32 (jax_flash.decode passes a contiguous cache as one page per sequence), so there is one kernel per op:

  decode(q, k_pool, v_pool, lengths, page_table) -> (out, lse)        q/out [batch, q_len, heads, head_dim],
                                                                      lse [batch, heads, q_len] float32
  kv_cache_update(k_pool, v_pool, new_k, new_v, positions, page_table) -> (k_pool, v_pool), updated in place: the
                                                                      results alias the first two operands.

Both take a static `contiguous`: whether the pool is a contiguous cache [batch, max_len, ...] and the page table the
identity, which lets a mesh split the cache along the batch (_decode_partitioning.py).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import batching, mlir

from jax_flash import _ffi, _jax_internals
from jax_flash._config import AttentionConfig
from jax_flash._decode_partitioning import partitioned_decode, partitioned_update
from jax_flash._primitives import _check_platform, _lse_aval

decode_p = Primitive("jax_flash_decode")
decode_p.multiple_results = True
kv_cache_update_p = Primitive("jax_flash_kv_cache_update")
kv_cache_update_p.multiple_results = True


def _decode_abstract_eval(q, k, v, lengths, page_table, *, config: AttentionConfig, contiguous: bool):
    del k, v, lengths, page_table, config, contiguous  # validated by jax_flash.decode before binding
    return q.update(weak_type=False), _lse_aval(q)


def _update_abstract_eval(k, v, new_k, new_v, positions, page_table, *, contiguous: bool):
    del new_k, new_v, positions, page_table, contiguous
    return k.update(weak_type=False), v.update(weak_type=False)


decode_p.def_abstract_eval(_decode_abstract_eval)
kv_cache_update_p.def_abstract_eval(_update_abstract_eval)


def _compiled_impl(primitive):
    """Eager calls compile the primitive alone, as jax does for its own primitives."""

    def impl(*args, **params):
        return jax.jit(lambda *a: primitive.bind(*a, **params))(*args)

    return impl


decode_p.def_impl(_compiled_impl(decode_p))
kv_cache_update_p.def_impl(_compiled_impl(kv_cache_update_p))


# The CUDA kernels split the keys of each (sequence, kv head, pass of 16 packed query rows) across thread blocks only
# while there are too few of those items to fill the GPU, at most 128 ways and with at least 256 keys a split; their
# partial outputs and lse (head_dim + 1 floats per output row and split) go through a workspace that XLA allocates
# as a third output of the custom call, sized here from the static shapes (no allocation inside the call, as capture
# into XLA's command buffers would need). _MAX_BLOCK_SLOTS bounds the thread blocks one wave of any GPU holds (an
# H200 runs 264 of the default kernel's); the CUDA planner caps its split count to the workspace it gets.
_MAX_SPLITS, _MIN_KEYS_PER_SPLIT, _ROWS_PER_PASS, _MAX_BLOCK_SLOTS = 128, 256, 16, 1024


def decode_workspace_elements(q_shape, kv_heads: int, capacity: int) -> int:
    """Float32 elements of the CUDA decode workspace for query [batch, q_len, heads, head_dim] against a cache of
    `capacity` positions per sequence (at least 1: XLA buffers of no elements may have no address)."""
    batch, q_len, heads, head_dim = q_shape
    items = max(batch * kv_heads * -(-q_len * (heads // kv_heads) // _ROWS_PER_PASS), 1)
    splits = min(_MAX_SPLITS, -(-capacity // _MIN_KEYS_PER_SPLIT), -(-_MAX_BLOCK_SLOTS // items))
    if splits <= 1:
        return 1
    return max(splits * batch * q_len * heads * (head_dim + 1), 1)


def _decode_call(q, k, v, lengths, page_table, config: AttentionConfig, *, platform: str):
    """The FFI decode kernel on (local) operands; on CUDA its workspace is a third result, dropped here."""
    batch, q_len, heads, _ = q.shape
    results = [jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((batch, heads, q_len), jnp.float32)]
    if platform == "cuda":
        capacity = page_table.shape[1] * k.shape[1]
        results.append(jax.ShapeDtypeStruct((decode_workspace_elements(q.shape, k.shape[2], capacity),),
                                            jnp.float32))
    call = jax.ffi.ffi_call(_ffi.target_name("decode", platform), results)
    return tuple(call(q, k, v, lengths, page_table, **config.ffi_attributes())[:2])


def _update_call(k, v, new_k, new_v, positions, page_table, *, platform: str):
    results = (jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype))
    call = jax.ffi.ffi_call(_ffi.target_name("kv_cache_update", platform), results, input_output_aliases={0: 0, 1: 1})
    return tuple(call(k, v, new_k, new_v, positions, page_table))


# One function object per platform: the partitioned kernels are cached by it.
_DECODE_CALLS = {p: functools.partial(_decode_call, platform=p) for p in ("cpu", "cuda")}
_UPDATE_CALLS = {p: functools.partial(_update_call, platform=p) for p in ("cpu", "cuda")}


def _decode_lowering(platform: str):
    def rule(ctx, *operands, config: AttentionConfig, contiguous: bool):
        _check_platform(platform, ctx.avals_in[0].shape[-1])
        kernel = partitioned_decode(_DECODE_CALLS[platform], ctx.avals_in[0].shape[2], ctx.avals_in[1].shape[2],
                                    contiguous)
        return mlir.lower_fun(lambda *args: kernel(config, *args), multiple_results=True)(ctx, *operands)

    return rule


def _update_lowering(platform: str):
    def rule(ctx, *operands, contiguous: bool):
        _check_platform(platform, ctx.avals_in[0].shape[-1])
        kernel = partitioned_update(_UPDATE_CALLS[platform], ctx.avals_in[0].shape[2], contiguous)
        return mlir.lower_fun(kernel, multiple_results=True)(ctx, *operands)

    return rule


for _platform in ("cpu", "cuda"):
    mlir.register_lowering(decode_p, _decode_lowering(_platform), platform=_platform)
    mlir.register_lowering(kv_cache_update_p, _update_lowering(_platform), platform=_platform)


# Batching: the vmapped axis (size n) is merged into the batch axis. Per-sequence operands (query, lengths or
# positions, new rows, page table) become [n * batch, ...]; the page pools become [n * pages, ...] with each vmapped
# table shifted to its own pool's pages. A pool that is not vmapped while other operands are stays shared for
# decode (it is only read) and is copied per instance for the update (each instance gets its own updated cache).


def _leading(x, dim, size):
    """x with the vmapped axis at 0, broadcast to `size` when x is not mapped (dim None)."""
    return jnp.broadcast_to(x, (size, *x.shape)) if dim is None else jnp.moveaxis(x, dim, 0)


def _merge(x):
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])


def _vmapped_size(args, dims):
    return next(a.shape[d] for a, d in zip(args, dims) if d is not None)


def _merge_pools(k, v, table, k_dim, v_dim, table_dim, size, share_unmapped: bool):
    """(k, v, table) with the vmapped axis merged; pools merged when mapped (or when they may not be shared)."""
    if share_unmapped and k_dim is None and v_dim is None:
        return k, v, _merge(_leading(table, table_dim, size))
    k, v, table = (_leading(x, d, size) for x, d in ((k, k_dim), (v, v_dim), (table, table_dim)))
    num_pages = k.shape[1]
    offsets = (jnp.arange(size, dtype=table.dtype) * num_pages)[:, None, None]
    return _merge(k), _merge(v), _merge(table + offsets)


def _decode_batch(args, dims, *, config, contiguous):
    q, k, v, lengths, table = args
    q_dim, k_dim, v_dim, lengths_dim, table_dim = dims
    size = _vmapped_size(args, dims)
    # A shared contiguous cache is no longer one page per sequence of the merged batch.
    contiguous = contiguous and not (k_dim is None and v_dim is None)
    k, v, table = _merge_pools(k, v, table, k_dim, v_dim, table_dim, size, share_unmapped=True)
    q, lengths = _merge(_leading(q, q_dim, size)), _merge(_leading(lengths, lengths_dim, size))
    out, lse = decode_p.bind(q, k, v, lengths, table, config=config, contiguous=contiguous)
    return [r.reshape(size, r.shape[0] // size, *r.shape[1:]) for r in (out, lse)], [0, 0]


def _update_batch(args, dims, *, contiguous):
    k, v, new_k, new_v, positions, table = args
    k_dim, v_dim, new_k_dim, new_v_dim, positions_dim, table_dim = dims
    size = _vmapped_size(args, dims)
    pages = k.shape[0 if k_dim is None else 1]
    k, v, table = _merge_pools(k, v, table, k_dim, v_dim, table_dim, size, share_unmapped=False)
    new_k, new_v, positions = (_merge(_leading(x, d, size))
                               for x, d in ((new_k, new_k_dim), (new_v, new_v_dim), (positions, positions_dim)))
    k, v = kv_cache_update_p.bind(k, v, new_k, new_v, positions, table, contiguous=contiguous)
    return [x.reshape(size, pages, *x.shape[1:]) for x in (k, v)], [0, 0]


batching.primitive_batchers[decode_p] = _decode_batch
batching.primitive_batchers[kv_cache_update_p] = _update_batch
_jax_internals.require_devices_during_lowering(decode_p, kv_cache_update_p)
