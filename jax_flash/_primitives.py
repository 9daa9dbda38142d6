"""The attention primitives: abstract evaluation, per-platform lowering to the FFI targets (with their sharding
rules, jax_flash._partitioning), and batching.

attention_fwd(q, k, v, *tokens) -> (out, lse) and attention_bwd(dout, q, k, v, out, lse, *tokens) -> (dq, dk, dv),
with q/out/dout [batch, seq_q, heads_q, head_dim], k/v [batch, seq_k, heads_kv, head_dim], lse [batch, heads_q, seq_q]
float32, and tokens the int32 token-mask operands that config.token_inputs names (lengths [batch], query segment ids
and positions [batch, seq_q], key/value ones [batch, seq_k]).
Autodiff lives one level up (jax_flash.attention), as a custom_vjp over these two.

attention_fp8_fwd(q, k, v, descale, *tokens) -> (out, lse) is the inference-only FP8 forward: float8_e4m3fn q, k,
v, descale float32 [2] = (query_scale * key_scale, value_scale), out bfloat16. It runs the Hopper FP8 kernel where
that exists (an sm_90 GPU, head_dim a multiple of 16 up to 128, a build with it), and elsewhere dequantizes to
bfloat16 and runs attention_fwd.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import batching, mlir

from jax_flash import _ffi, _jax_internals, _partitioning
from jax_flash._config import AttentionConfig

attention_fwd_p = Primitive("jax_flash_attention_fwd")
attention_fwd_p.multiple_results = True
attention_bwd_p = Primitive("jax_flash_attention_bwd")
attention_bwd_p.multiple_results = True
attention_fp8_fwd_p = Primitive("jax_flash_attention_fp8_fwd")
attention_fp8_fwd_p.multiple_results = True

# What each platform's kernels accept; the lowering turns anything else into a trace-time error.
_HEAD_DIM_MULTIPLE = {"cpu": 1, "cuda": 8}
MAX_HEAD_DIM = 256
# The CUDA kernels are built as sm80 code (and sm90a) plus PTX for newer GPUs; none runs on an older GPU.
MIN_COMPUTE_CAPABILITY = (8, 0)


# Results are derived from the operands' types with update(), which keeps what JAX tracks beyond shape and dtype
# (the mesh sharding, and inside shard_map the manual axes a value varies over).
def _lse_aval(q):
    batch, seq_q, heads_q, _ = q.shape
    spec = tuple(q.sharding.spec)
    return q.update(shape=(batch, heads_q, seq_q), dtype=jnp.float32, weak_type=False,
                    sharding=q.sharding.update(spec=(spec[0], spec[2], spec[1])))


def _fwd_abstract_eval(q, k, v, *tokens, config: AttentionConfig):
    del k, v, tokens, config  # validated by jax_flash.attention before binding
    return q.update(weak_type=False), _lse_aval(q)


def _bwd_abstract_eval(dout, q, k, v, out, lse, *tokens, config: AttentionConfig):
    del dout, out, lse, tokens, config
    return q.update(weak_type=False), k.update(weak_type=False), v.update(weak_type=False)


def _fp8_fwd_abstract_eval(q, k, v, descale, *tokens, config: AttentionConfig):
    del k, v, descale, tokens, config  # validated by jax_flash.fp8 before binding
    return q.update(dtype=jnp.bfloat16, weak_type=False), _lse_aval(q)


attention_fwd_p.def_abstract_eval(_fwd_abstract_eval)
attention_bwd_p.def_abstract_eval(_bwd_abstract_eval)
attention_fp8_fwd_p.def_abstract_eval(_fp8_fwd_abstract_eval)


def _compiled_impl(primitive):
    """Eager (un-jitted) calls compile the primitive alone, as jax does for its own primitives."""

    def impl(*args, config):
        return jax.jit(lambda *a: primitive.bind(*a, config=config))(*args)

    return impl


attention_fwd_p.def_impl(_compiled_impl(attention_fwd_p))
attention_bwd_p.def_impl(_compiled_impl(attention_bwd_p))
attention_fp8_fwd_p.def_impl(_compiled_impl(attention_fp8_fwd_p))


def _local_gpus() -> list:
    """This process's GPUs; none when lowering for CUDA on a machine without one (export)."""
    try:
        return jax.local_devices(backend="gpu")
    except RuntimeError:
        return []


def _compute_capability(device) -> tuple[int, ...] | None:
    capability = getattr(device, "compute_capability", None)
    return tuple(int(part) for part in capability.split(".")) if capability else None


def _check_platform(platform: str, head_dim: int) -> None:
    if platform not in _ffi.compiled_platforms():
        raise NotImplementedError(
            f"jax_flash was built without {platform} kernels (compiled: {_ffi.compiled_platforms()}); reinstall it "
            f"on a machine with the CUDA compiler, or pass implementation='xla'")
    if platform == "cuda":
        for gpu in _local_gpus():
            capability = _compute_capability(gpu)
            # Otherwise the launch would fail at run time with CUDA's "no kernel image is available".
            if capability is not None and capability < MIN_COMPUTE_CAPABILITY:
                raise NotImplementedError(
                    f"jax_flash's CUDA kernels need a GPU of compute capability 8.0 or newer (Ampere on); "
                    f"{gpu.device_kind} ({gpu}) has {gpu.compute_capability}. Pass implementation='xla', or use "
                    f"jax.nn.dot_product_attention")
    multiple = _HEAD_DIM_MULTIPLE[platform]
    if head_dim % multiple:
        raise ValueError(f"head_dim={head_dim} is not supported on {platform}: it must be a multiple of {multiple} "
                         f"and at most {MAX_HEAD_DIM}; pass implementation='xla' for other sizes")


def _lowering(op: str, platform: str):
    target = _ffi.target_name(op, platform)

    def rule(ctx, *operands, config: AttentionConfig):
        # q is operand 0 of the forward and operand 1 of the backward (after dout); both carry head_dim last.
        _check_platform(platform, ctx.avals_in[0].shape[-1])
        return _partitioning.lower(ctx, operands, op=op, target=target, config=config)

    return rule


for _platform in ("cpu", "cuda"):
    mlir.register_lowering(attention_fwd_p, _lowering("attention_fwd", _platform), platform=_platform)
    mlir.register_lowering(attention_bwd_p, _lowering("attention_bwd", _platform), platform=_platform)


def dequantize_fp8(q, k, v, query_key_scale, value_scale):
    """e4m3 q, k, v as bfloat16 for the bfloat16 kernels: the key exactly (every e4m3 value is a bfloat16 one), the
    query times query_scale * key_scale (both logit scales ride on it) and the value times value_scale, each rounded
    once to bfloat16."""
    q = (q.astype(jnp.float32) * query_key_scale).astype(jnp.bfloat16)
    v = (v.astype(jnp.float32) * value_scale).astype(jnp.bfloat16)
    return q, k.astype(jnp.bfloat16), v


def _dequantized_fp8_forward(q, k, v, descale, *tokens, config: AttentionConfig):
    """The FP8 forward on the bfloat16 kernels."""
    return attention_fwd_p.bind(*dequantize_fp8(q, k, v, descale[0], descale[1]), *tokens, config=config)


def fp8_kernel_applies(head_dim: int, scale: float = 1.0, softcap: float = 0.0) -> bool:
    """Whether the CUDA lowering of attention_fp8_fwd runs the FP8 kernel: built with it, sm_90 GPUs only (sm_90a
    code runs on nothing else), Hopper kernels not switched off, a head_dim it holds, and not a negative scale
    without a soft cap (its row maxima are taken over the unscaled scores, as in the Hopper forward)."""
    if not (_ffi.fp8_kernels() and _ffi.kernel_choice() == "auto" and head_dim % 16 == 0 and head_dim <= 128):
        return False
    if scale < 0 and not softcap > 0:
        return False
    gpus = _local_gpus()  # none when lowering for CUDA without a GPU: then the path that runs anywhere
    return bool(gpus) and all(_compute_capability(d) == (9, 0) for d in gpus)


def _fp8_lowering(platform: str):
    kernel = _lowering("attention_fp8_fwd", platform)
    dequantized = mlir.lower_fun(_dequantized_fp8_forward, multiple_results=True)

    def rule(ctx, *operands, config: AttentionConfig):
        if platform == "cuda" and fp8_kernel_applies(ctx.avals_in[0].shape[-1], config.scale, config.softcap):
            return kernel(ctx, *operands, config=config)
        return dequantized(ctx, *operands, config=config)

    return rule


for _platform in ("cpu", "cuda"):
    mlir.register_lowering(attention_fp8_fwd_p, _fp8_lowering(_platform), platform=_platform)
_jax_internals.require_devices_during_lowering(attention_fwd_p, attention_bwd_p, attention_fp8_fwd_p)


def _fold_vmap_axis(args, dims):
    """Moves each vmapped axis to the front (broadcasting unbatched operands) and merges it into the batch axis.

    JAX passes None as the batch dimension of an operand that is not mapped.
    """
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    folded = []
    for a, d in zip(args, dims):
        a = jnp.broadcast_to(a, (size, *a.shape)) if d is None else jnp.moveaxis(a, d, 0)
        folded.append(a.reshape(size * a.shape[1], *a.shape[2:]))
    return size, folded


def _batch_rule(primitive):
    """vmap of `primitive`: one call on the folded batch, every result mapped on axis 0."""

    def rule(args, dims, *, config):
        size, folded = _fold_vmap_axis(args, dims)
        results = primitive.bind(*folded, config=config)
        return [r.reshape(size, r.shape[0] // size, *r.shape[1:]) for r in results], [0] * len(results)

    return rule


batching.primitive_batchers[attention_fwd_p] = _batch_rule(attention_fwd_p)
batching.primitive_batchers[attention_bwd_p] = _batch_rule(attention_bwd_p)


def _fp8_batch_rule(args, dims, *, config):
    """vmap of attention_fp8_fwd: one call on the folded batch when the scales are shared, else one per instance."""
    q, k, v, descale, *tokens = args
    q_dim, k_dim, v_dim, descale_dim, *token_dims = dims
    if descale_dim is None:
        size, (q, k, v, *tokens) = _fold_vmap_axis([q, k, v, *tokens], [q_dim, k_dim, v_dim, *token_dims])
        results = attention_fp8_fwd_p.bind(q, k, v, descale, *tokens, config=config)
        return [r.reshape(size, r.shape[0] // size, *r.shape[1:]) for r in results], [0, 0]
    args = [a if d is None else jnp.moveaxis(a, d, 0) for a, d in zip(args, dims)]
    mapped = [d is not None for d in dims]

    def one(instance):
        it = iter(instance)
        return attention_fp8_fwd_p.bind(*(next(it) if m else a for a, m in zip(args, mapped)), config=config)

    results = jax.lax.map(one, [a for a, m in zip(args, mapped) if m])
    return list(results), [0, 0]


batching.primitive_batchers[attention_fp8_fwd_p] = _fp8_batch_rule
