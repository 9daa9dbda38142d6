"""jax_flash.dot_product_attention: the public entry point, mirroring jax.nn.dot_product_attention."""

from __future__ import annotations

import functools

import jax

from jax_flash import _jax_internals, _validation
from jax_flash._config import AttentionConfig
from jax_flash._primitives import attention_bwd_p, attention_fwd_p
from jax_flash.reference import attention_reference

IMPLEMENTATIONS = (None, "xla")


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _flash_attention(query, key, value, config: AttentionConfig):
    out, _ = attention_fwd_p.bind(query, key, value, config=config)
    return out


def _flash_attention_fwd(query, key, value, config):
    out, lse = attention_fwd_p.bind(query, key, value, config=config)
    return out, (query, key, value, out, lse)


def _flash_attention_bwd(config, residuals, dout):
    query, key, value, out, lse = residuals
    dq, dk, dv = attention_bwd_p.bind(dout, query, key, value, out, lse, config=config)
    return dq, dk, dv


_flash_attention.defvjp(_flash_attention_fwd, _flash_attention_bwd)


def dot_product_attention(query, key, value, bias=None, mask=None, *, scale=None, is_causal: bool = False,
                          query_seq_lengths=None, key_value_seq_lengths=None, local_window_size=None,
                          implementation=None, softcap=None):
    """Scaled dot-product attention, softmax(scale * q k^T) v, with jax.nn.dot_product_attention's arguments.

    Args:
      query: [batch, seq_q, heads_q, head_dim] (or [seq_q, heads_q, head_dim]).
      key, value: [batch, seq_k, heads_kv, head_dim]; heads_q must be a multiple of heads_kv (GQA/MQA), and the
        kernels read each K/V head once instead of repeating it (under vmap, unbatched K/V are broadcast).
      bias, mask, query_seq_lengths, key_value_seq_lengths: not supported yet; passing one raises.
      scale: softmax scale, a concrete number; default 1/sqrt(head_dim).
      is_causal: query i sees keys j <= i (top-left aligned, as in jax.nn).
      local_window_size: int w or (left, right): query i sees keys i-left <= j <= i+right.
      implementation: None for jax_flash's kernels on the current platform, 'xla' for the pure-JAX reference.
      softcap: if > 0, logits s become softcap * tanh(s / softcap) before the softmax; None or 0 means no capping.

    Returns:
      The attention output, shaped and typed like query. Rows that see no key are 0.
    """
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
    for name, arg, instead in (
            ("bias", bias, "no bias term is supported yet"),
            ("mask", mask, "use is_causal or local_window_size"),
            ("query_seq_lengths", query_seq_lengths, "sequence lengths are not supported yet"),
            ("key_value_seq_lengths", key_value_seq_lengths, "sequence lengths are not supported yet")):
        if arg is not None:
            raise NotImplementedError(f"jax_flash.dot_product_attention does not accept {name}: {instead}")
    _validation.check_qkv(query, key, value)
    scale, softcap = _validation.scale_and_softcap(query.shape[-1], scale, softcap)
    window_left, window_right = _validation.window_bounds(local_window_size, is_causal)
    config = AttentionConfig(scale, window_left, window_right, softcap)

    unbatched = query.ndim == 3
    if unbatched:
        query, key, value = query[None], key[None], value[None]
    if implementation == "xla":
        out = attention_reference(query, key, value, scale=scale, window_left=window_left,
                                  window_right=window_right, softcap=softcap)
    else:
        out = _flash_attention(*_jax_internals.match_varying_axes(query, key, value), config)
    return out[0] if unbatched else out
