"""A drop-in `attention_fn` for Flax's attention layers that runs jax_flash's kernels.

flax.linen.MultiHeadDotProductAttention and flax.nnx.MultiHeadAttention call their `attention_fn` with the keyword
arguments of Flax's own dot_product_attention (linen passes only those the function's signature names; nnx always
passes the same set). The function made here names every one of them, so it plugs into either layer, and it
refuses, with the replacement to use, each option that jax_flash's kernels cannot honour instead of ignoring it.
"""

from __future__ import annotations

import math

import jax.numpy as jnp

from jax_flash.attention import dot_product_attention


def make_attention_fn(is_causal: bool = False, local_window_size=None, softcap=None):
    """An attention_fn for Flax's attention layers, with jax_flash's masking and soft-capping fixed in advance.

    Flax describes masks as boolean arrays, which the kernels never read: they build causal and local-window masks
    from these static settings instead. `is_causal` and `local_window_size` follow jax.nn.dot_product_attention
    (top-left aligned causal mask, window `w` or `(left, right)`); `softcap` caps the scaled logits s as
    softcap * tanh(s / softcap).
    """
    # Named apart because the attention_fn below takes an is_causal of its own (nnx passes one on every call).
    fixed_causal = is_causal

    def attention_fn(query, key, value, bias=None, mask=None, broadcast_dropout=True, dropout_rng=None,
                     dropout_rate=0.0, deterministic=False, dtype=None, precision=None, module=None,
                     force_fp32_for_softmax=False, einsum_dot_general=None, qk_attn_weights_einsum=None,
                     attn_weights_value_einsum=None, promote_dtype=None, is_causal=False):
        """Flax's dot_product_attention signature: query [batch..., q_len, heads, head_dim], key/value [batch...,
        kv_len, kv_heads, head_dim] (kv_heads dividing heads) -> [batch..., q_len, heads, head_dim].

        `is_causal` here is what nnx.MultiHeadAttention passes per call; it adds to the causal mask fixed in
        make_attention_fn. `broadcast_dropout` and `dropout_rng` only matter with dropout, which is refused.
        `precision` and `force_fp32_for_softmax` are satisfied as they stand: the kernels always accumulate the
        logits, the softmax and the output in float32.
        """
        _refuse_unsupported(bias=bias, mask=mask, dropout_rate=dropout_rate, deterministic=deterministic,
                            module=module, custom_einsums=(einsum_dot_general, qk_attn_weights_einsum,
                                                           attn_weights_value_einsum))
        if promote_dtype is None:
            dtype = jnp.result_type(query, key, value) if dtype is None else dtype
            query, key, value = (x.astype(dtype) for x in (query, key, value))
        else:  # nnx's convention: one tuple in, one tuple out
            query, key, value = promote_dtype((query, key, value), dtype=dtype)
        # Flax divides the query by sqrt(head_dim) in the query's dtype before the logits matmul; doing the same, and
        # then asking the kernel for scale 1, keeps the rounding (and the gradient path) of the layer it replaces.
        query = query / jnp.asarray(math.sqrt(query.shape[-1]), query.dtype)
        batch_shape = query.shape[:-3]
        out = dot_product_attention(_merge_batch(query), _merge_batch(key), _merge_batch(value), scale=1.0,
                                    is_causal=fixed_causal or is_causal, local_window_size=local_window_size,
                                    softcap=softcap)
        return out.reshape(*batch_shape, *out.shape[1:])

    return attention_fn


def _merge_batch(x):
    """[batch..., seq, heads, head_dim] -> [B, seq, heads, head_dim]: Flax allows any number of batch axes (none
    included); the kernels take exactly one."""
    return x.reshape(-1, *x.shape[-3:])


def _refuse_unsupported(*, bias, mask, dropout_rate, deterministic, module, custom_einsums) -> None:
    if bias is not None:
        raise NotImplementedError("jax_flash.flax.attention_fn does not support an attention bias: the kernels have "
                                  "no bias input; use Flax's default attention_fn for biased attention")
    if mask is not None:
        raise NotImplementedError(
            "jax_flash.flax.attention_fn does not take a mask array (a mask= argument, or decode=True, which builds "
            "one): the kernels build causal and local-window masks themselves. Pass "
            "attention_fn=jax_flash.flax.make_attention_fn(is_causal=True) instead of a make_causal_mask(...) mask "
            "(or make_attention_fn(local_window_size=...) for a sliding window)")
    if dropout_rate > 0 and not deterministic:
        raise NotImplementedError(
            f"jax_flash.flax.attention_fn does not support attention dropout (dropout_rate={dropout_rate} with "
            f"deterministic=False): set the layer's dropout_rate=0 (dropout can go on the layer's output instead) or "
            f"run it with deterministic=True")
    if module is not None:
        raise NotImplementedError("jax_flash.flax.attention_fn cannot sow attention weights (sow_weights=True): the "
                                  "kernels never form the attention matrix; use Flax's default attention_fn to "
                                  "inspect it")
    if any(einsum is not None for einsum in custom_einsums):
        raise NotImplementedError("jax_flash.flax.attention_fn cannot use custom einsums or dot_generals (e.g. "
                                  "quantized ones): the kernels do their own matmuls; use Flax's default "
                                  "attention_fn with them")


attention_fn = make_attention_fn()
