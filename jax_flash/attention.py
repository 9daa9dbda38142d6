"""jax_flash.dot_product_attention: the public entry point, mirroring jax.nn.dot_product_attention."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jax_flash import _jax_internals, _token_mask, _validation
from jax_flash._config import AttentionConfig
from jax_flash._primitives import attention_bwd_p, attention_fwd_p
from jax_flash.reference import attention_reference

IMPLEMENTATIONS = (None, "xla")


# (out, lse). The caller stops lse's gradient (as jax.nn does for its residual), so the backward ignores its cotangent.
@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _flash_attention(query, key, value, tokens: tuple, config: AttentionConfig):
    out, lse = attention_fwd_p.bind(query, key, value, *tokens, config=config)
    return out, lse


def _flash_attention_fwd(query, key, value, tokens, config):
    out, lse = attention_fwd_p.bind(query, key, value, *tokens, config=config)
    return (out, lse), (query, key, value, tokens, out, lse)


def _flash_attention_bwd(config, residuals, cotangents):
    query, key, value, tokens, out, lse = residuals
    dout, _ = cotangents
    dq, dk, dv = attention_bwd_p.bind(dout, query, key, value, out, lse, *tokens, config=config)
    return dq, dk, dv, None  # the int32 token-mask operands have no gradient


_flash_attention.defvjp(_flash_attention_fwd, _flash_attention_bwd)


def attention_config(query, key, *, scale, is_causal, query_seq_lengths, key_value_seq_lengths, local_window_size,
                     softcap, segment_ids, segment_positions, deterministic=False):
    """(AttentionConfig, token-mask operands by name) of a call with dot_product_attention's arguments, checked."""
    scale, softcap = _validation.scale_and_softcap(query.shape[-1], scale, softcap)
    window_left, window_right = _validation.window_bounds(local_window_size, is_causal)
    tokens = _token_mask.token_operands(query, key, query_seq_lengths=query_seq_lengths,
                                        key_value_seq_lengths=key_value_seq_lengths, segment_ids=segment_ids,
                                        segment_positions=segment_positions)
    return AttentionConfig(scale, window_left, window_right, softcap, tuple(tokens), deterministic), tokens


def dot_product_attention(query, key, value, bias=None, mask=None, *, scale=None, is_causal: bool = False,
                          query_seq_lengths=None, key_value_seq_lengths=None, local_window_size=None,
                          implementation=None, softcap=None, segment_ids=None, segment_positions=None,
                          deterministic: bool = False, return_residual: bool = False):
    """Scaled dot-product attention, softmax(scale * q k^T) v, with jax.nn.dot_product_attention's arguments.

    Args:
      query: [batch, seq_q, heads_q, head_dim] (or [seq_q, heads_q, head_dim]).
      key, value: [batch, seq_k, heads_kv, head_dim]; heads_q must be a multiple of heads_kv (GQA/MQA), and the
        kernels read each K/V head once instead of repeating it (under vmap, unbatched K/V are broadcast).
      bias, mask: not supported; passing one raises.
      scale: softmax scale, a concrete number; default 1/sqrt(head_dim).
      is_causal: query i sees keys j <= i (top-left aligned, as in jax.nn).
      query_seq_lengths, key_value_seq_lengths: int32 [batch] (as in jax.nn; [1] for inputs without a batch axis):
        query rows i >= query_seq_lengths[b] output 0, keys j >= key_value_seq_lengths[b] are seen by no query.
      local_window_size: int w or (left, right): query i sees keys i-left <= j <= i+right.
      implementation: None for jax_flash's kernels on the current platform, 'xla' for the pure-JAX reference.
      softcap: if > 0, logits s become softcap * tanh(s / softcap) before the softmax; None or 0 means no capping.
      segment_ids: int32 [batch, seq] for self-attention (seq_q == seq_k), or a (query, key_value) tuple of
        [batch, seq_q] and [batch, seq_k] arrays: query i sees key j only when their segment ids are equal (packed
        sequences). Any int32 values; no value is special.
      segment_positions: same forms as segment_ids: the positions that is_causal and local_window_size compare
        instead of the indices i and j (e.g. each token's position within its document).
      deterministic: True asks for gradients that are bitwise identical run to run. False (the default) lets the
        Hopper backward (head dims 65 to 128, at least 2048 queries) sum dQ in one pass with reduce-adds, faster
        and equally accurate but in an order that varies between runs; every other call is deterministic either way.
      return_residual: also return the softmax's log-sum-exp (natural log) of each query row's scaled logits, as
        jax.nn does: shape [batch, seq_q, heads_q] ([seq_q, heads_q] unbatched), in query's dtype, with its
        gradient stopped.

    Returns:
      The attention output, shaped and typed like query, or (output, residual) when return_residual. Rows that see
      no key (past their length, in a segment absent from the keys, or outside every window) are 0, and so are
      their gradients; their residual is -inf (where jax.nn's XLA path gives a large negative number).
    """
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
    for name, arg, instead in (
            ("bias", bias, "no bias term is supported yet"),
            ("mask", mask, "use is_causal, local_window_size, the *_seq_lengths or segment_ids")):
        if arg is not None:
            raise NotImplementedError(f"jax_flash.dot_product_attention does not accept {name}: {instead}")
    _validation.check_qkv(query, key, value)
    for name, flag in (("deterministic", deterministic), ("return_residual", return_residual)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {flag!r}")
    config, tokens = attention_config(query, key, scale=scale, is_causal=is_causal,
                                      query_seq_lengths=query_seq_lengths,
                                      key_value_seq_lengths=key_value_seq_lengths,
                                      local_window_size=local_window_size, softcap=softcap, segment_ids=segment_ids,
                                      segment_positions=segment_positions, deterministic=deterministic)
    scale, window_left, window_right, softcap = config.scale, config.window_left, config.window_right, config.softcap

    unbatched = query.ndim == 3
    if unbatched:
        query, key, value = query[None], key[None], value[None]
    if implementation == "xla":
        out, lse = attention_reference(query, key, value, scale=scale, window_left=window_left,
                                       window_right=window_right, softcap=softcap, return_lse=True, **tokens)
    else:
        # The token-mask operands join the varying-axes match so that inside shard_map they vary like q, k, v.
        query, key, value, *token_arrays = _jax_internals.match_varying_axes(query, key, value, *tokens.values())
        out, lse = _flash_attention(query, key, value, tuple(token_arrays), config)
    if unbatched:
        out, lse = out[0], lse[0]
    if not return_residual:
        return out
    # lse is [..., heads, seq_q] float32; jax.nn's residual is [..., seq_q, heads] in the inputs' dtype.
    return out, jax.lax.stop_gradient(jnp.swapaxes(lse, -1, -2).astype(out.dtype))
