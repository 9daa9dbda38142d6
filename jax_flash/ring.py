"""jax_flash.ring_attention: attention over a sequence sharded across devices (context parallelism), in shard_map.

Every device keeps its query block and passes its key/value block around the ring of `axis_name`; after n - 1 hops
each query block has met every key/value block, and the kernel's partial results are merged with their log-sum-exp.
The backward goes around the ring once more: each block's dk/dv travel with it and are home after the last hop.
Given the final out and lse, the kernel's backward on one block pair is that pair's exact share of the gradient.

Causal attention on a contiguous split would leave device 0 with one block pair to compute and device n - 1 with n.
Causal ring attention therefore takes the zig-zag layout: the sequence is cut into 2n chunks and device i holds
chunks i and 2n - 1 - i (`zigzag_permutation` gives the token order). At every hop after the first, each device then
does exactly half a block pair's work: the key/value block of an earlier device is seen whole by all local queries
but only its first chunk is in their past, and that of a later device is seen only by the local second chunk.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_flash import _jax_internals, _token_mask, _validation
from jax_flash._config import AttentionConfig
from jax_flash._primitives import attention_bwd_p, attention_fwd_p


def zigzag_permutation(seq_len: int, num_shards: int) -> np.ndarray:
    """The token order that balances causal ring attention: position p of the sharded sequence holds token perm[p].

    Reorder the sequence axis with it before sharding (`x[:, perm]`, token ids and position ids alike) and undo it
    on the output with `np.argsort(perm)`. seq_len must be a multiple of 2 * num_shards.
    """
    if seq_len % (2 * num_shards):
        raise ValueError(f"the zig-zag layout needs seq_len ({seq_len}) to be a multiple of 2 * num_shards "
                         f"({2 * num_shards})")
    chunks = np.arange(seq_len).reshape(2 * num_shards, -1)
    return np.concatenate([np.concatenate([chunks[i], chunks[-1 - i]]) for i in range(num_shards)])


def ring_attention(query, key, value, *, axis_name, is_causal: bool = False, scale=None, softcap=None,
                   segment_ids=None, local_window_size=None):
    """softmax(scale * q k^T) v over a sequence sharded on `axis_name`; call it inside jax.shard_map.

    Args:
      query: the local block [batch, seq_q / n, heads_q, head_dim] of a query sharded over axis_name on axis 1.
      key, value: the local blocks [batch, seq_k / n, heads_kv, head_dim], sharded the same way.
      axis_name: the shard_map mesh axis (of size n) that splits the sequence.
      is_causal: causal attention over the whole sequence, which must be in the zig-zag layout of
        `zigzag_permutation` (the local query and key/value blocks then have the same even length).
      scale, softcap: as in jax_flash.dot_product_attention.
      segment_ids: packed documents, as in jax_flash.dot_product_attention, given as the local blocks (sharded and,
        when causal, permuted like the sequence): one int32 [batch, seq / n] array, or a (query, key_value) pair.
        Each key/value block's ids travel around the ring with it; block pairs of different documents are skipped
        by the kernels.
      local_window_size: w or (left, right), as in jax_flash.dot_product_attention, over the whole sequence: in the
        zig-zag layout when causal, else with device i holding the i-th contiguous block. Each block pair is then
        masked by its tokens' global positions (computed on each device), and tiles outside the window are skipped.

    Returns:
      The local block of the output, shaped and typed like query.
    """
    _validation.check_qkv(query, key, value)
    if query.ndim != 4:
        raise ValueError(f"ring_attention takes [batch, seq, heads, head_dim] blocks, got query shape {query.shape}")
    if is_causal and (query.shape[1] != key.shape[1] or query.shape[1] % 2):
        raise ValueError(f"causal ring_attention needs query and key blocks of the same even length (two zig-zag "
                         f"chunks each, see zigzag_permutation), got {query.shape[1]} and {key.shape[1]}")
    scale, softcap = _validation.scale_and_softcap(query.shape[-1], scale, softcap)
    tokens = _token_mask.token_operands(query, key, query_seq_lengths=None, key_value_seq_lengths=None,
                                        segment_ids=segment_ids, segment_positions=None)
    if local_window_size is None:  # causal masking, if any, comes from which chunks each hop pairs
        config = AttentionConfig(scale, softcap=softcap, token_inputs=tuple(tokens))
    else:  # the window (and the causal mask) over the global positions of each block pair's tokens
        window_left, window_right = _validation.window_bounds(local_window_size, is_causal)
        config = AttentionConfig(scale, window_left, window_right, softcap,
                                 token_inputs=tuple(tokens) + ("q_positions", "kv_positions"))
    query, key, value, *segments = _jax_internals.match_varying_axes(query, key, value, *tokens.values())
    return _ring(query, key, value, tuple(segments), axis_name, bool(is_causal), config)


# `segments`: () or the local (query ids, key/value ids); the key/value ids travel with their block.
@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _ring(query, key, value, segments, axis_name, causal, config):
    return _ring_fwd(query, key, value, segments, axis_name, causal, config)[0]


def _ring_fwd(query, key, value, segments, axis_name, causal, config):
    n, me = lax.axis_size(axis_name), lax.axis_index(axis_name)
    # K and V travel as one array: one collective per hop, in one dtype.
    kv, q_ids, kv_ids = jnp.stack([key, value]), *_split(segments)
    block = _BlockPairs(query, key, n, me, causal, config)
    out, lse = block.forward(query, q_ids, kv, kv_ids, 0)
    out = out.astype(jnp.float32)
    for hop in range(1, n):
        kv, kv_ids = _pass_on(kv, axis_name, n), _pass_on(kv_ids, axis_name, n)
        out, lse = _merge(out, lse, *block.forward(query, q_ids, kv, kv_ids, hop))
    out = out.astype(query.dtype)
    return out, (query, key, value, segments, out, lse)


def _ring_bwd(axis_name, causal, config, residuals, dout):
    query, key, value, segments, out, lse = residuals
    n, me = lax.axis_size(axis_name), lax.axis_index(axis_name)
    kv, q_ids, kv_ids = jnp.stack([key, value]), *_split(segments)
    block = _BlockPairs(query, key, n, me, causal, config)
    dq, dkv = block.backward(dout, query, q_ids, kv, kv_ids, out, lse, 0)
    for hop in range(1, n):
        # The gradient accumulator of the block travels with it (in float32: one dtype per collective).
        kv, kv_ids, dkv = (_pass_on(x, axis_name, n) for x in (kv, kv_ids, dkv))
        dq_block, dkv_block = block.backward(dout, query, q_ids, kv, kv_ids, out, lse, hop)
        dq, dkv = dq + dq_block, dkv + dkv_block
    dkv = _pass_on(dkv, axis_name, n)  # the last hop takes each block's gradient home
    # The segment ids are int32: no gradient.
    return dq.astype(query.dtype), dkv[0].astype(key.dtype), dkv[1].astype(value.dtype), None


_ring.defvjp(_ring_fwd, _ring_bwd)


def _split(segments):
    """(query ids, key/value ids), each None without segment ids."""
    return tuple(segments) if segments else (None, None)


def _pass_on(x, axis_name, n):
    """Device i sends x to device i + 1: after h hops device i holds the block of device i - h. None (no segment ids)
    stays None."""
    if x is None:
        return None
    return lax.ppermute(x, axis_name, perm=[(i, (i + 1) % n) for i in range(n)])


def _merge(out, lse, block_out, block_lse):
    """Combines two softmax-normalised partial results by their log-sum-exps (out float32 [B, S, H, D])."""
    merged = jnp.logaddexp(lse, block_lse)
    # Rows that no key has reached yet have lse -inf on both sides: shift by 0 there instead of making -inf - -inf.
    shift = jnp.where(jnp.isneginf(merged), 0.0, merged)

    def weight(x):  # [B, H, S] -> [B, S, H, 1], to scale the rows of out
        return jnp.swapaxes(jnp.exp(x - shift), 1, 2)[..., None]

    return weight(lse) * out + weight(block_lse) * block_out.astype(jnp.float32), merged


def _global_positions(device, n, batch, length, zigzag):
    """int32 [batch, length]: the positions in the whole sequence of the tokens that `device` holds."""
    if zigzag:  # chunks `device` and 2n - 1 - device of the sequence's 2n
        chunk = length // 2
        offsets = jnp.arange(chunk, dtype=jnp.int32)
        positions = jnp.concatenate([device * chunk + offsets, (2 * n - 1 - device) * chunk + offsets])
    else:
        positions = device * length + jnp.arange(length, dtype=jnp.int32)
    return jnp.broadcast_to(positions.astype(jnp.int32), (batch, length))


class _BlockPairs:
    """The kernel calls of one device's queries against the block that visits at each hop.

    Causal without a window, in the zig-zag layout (chunks a = me and b = 2n - 1 - me on this device), the block of
    device j = me - hop is: this device's own (hop 0: local causal masking is exactly the global mask); an earlier
    device's (j < me, i.e. hop <= me): both local chunks see its first chunk whole and its second chunk not at all;
    or a later device's (j > me): only the local second chunk sees it, whole. With a window, every pair is masked by
    its tokens' global positions instead.
    """

    def __init__(self, query, key, n, me, causal, config):
        self.n, self.me, self.causal, self.config = n, me, causal, config
        self.windowed = "q_positions" in config.token_inputs
        if self.windowed:  # the queries' positions are the same at every hop; the keys' are the visiting block's
            self.q_positions = _global_positions(me, n, query.shape[0], query.shape[1], causal)
            self.kv_positions = functools.partial(_global_positions, n=n, batch=key.shape[0], length=key.shape[1],
                                                  zigzag=causal)

    def _tokens(self, q_ids, kv_ids, hop):
        """The kernels' token-mask operands of a block pair, in TOKEN_INPUTS' order: the segment ids, then (with a
        window) the global positions of the local queries and of the keys of the device `hop` places back."""
        tokens = () if q_ids is None else (q_ids, kv_ids)
        if self.windowed:
            tokens += (self.q_positions, self.kv_positions((self.me - hop) % self.n))
        return tokens

    def forward(self, query, q_ids, kv, kv_ids, hop):
        """(out, lse) of the local queries against the visiting key/value block."""

        def attend(query, q_ids, key, value, kv_ids, config):
            out, lse = attention_fwd_p.bind(query, key, value, *self._tokens(q_ids, kv_ids, hop), config=config)
            return out, lse

        if self.windowed or not self.causal:  # positions carry the causal mask and the window across blocks
            return attend(query, q_ids, kv[0], kv[1], kv_ids, self.config)
        if hop == 0:
            return attend(query, q_ids, kv[0], kv[1], kv_ids, self.config._replace(window_right=0))
        half = query.shape[1] // 2

        def earlier(query, q_ids, kv, kv_ids):
            return attend(query, q_ids, kv[0, :, :half], kv[1, :, :half], _first(kv_ids, half), self.config)

        def later(query, q_ids, kv, kv_ids):
            out, lse = attend(query[:, half:], _second(q_ids, half), kv[0], kv[1], kv_ids, self.config)
            # The first chunk sees none of these keys: output 0 and lse -inf, as the kernel gives a row with no key.
            return (jnp.concatenate([jnp.zeros_like(out), out], axis=1),
                    jnp.concatenate([jnp.full_like(lse, -jnp.inf), lse], axis=2))

        return lax.cond(hop <= self.me, earlier, later, query, q_ids, kv, kv_ids)

    def backward(self, dout, query, q_ids, kv, kv_ids, out, lse, hop):
        """(dq, stacked dk/dv), float32, of the visiting block pair's share of the loss, given the final out and
        lse."""

        def grads(dout, query, q_ids, key, value, kv_ids, out, lse, config):
            dq, dk, dv = attention_bwd_p.bind(dout, query, key, value, out, lse, *self._tokens(q_ids, kv_ids, hop),
                                              config=config)
            return dq.astype(jnp.float32), jnp.stack([dk, dv]).astype(jnp.float32)

        if self.windowed or not self.causal:
            return grads(dout, query, q_ids, kv[0], kv[1], kv_ids, out, lse, self.config)
        if hop == 0:
            return grads(dout, query, q_ids, kv[0], kv[1], kv_ids, out, lse, self.config._replace(window_right=0))
        half = query.shape[1] // 2

        def earlier(dout, query, q_ids, kv, kv_ids, out, lse):
            dq, dkv = grads(dout, query, q_ids, kv[0, :, :half], kv[1, :, :half], _first(kv_ids, half), out, lse,
                            self.config)
            return dq, jnp.concatenate([dkv, jnp.zeros_like(dkv)], axis=2)

        def later(dout, query, q_ids, kv, kv_ids, out, lse):
            dq, dkv = grads(dout[:, half:], query[:, half:], _second(q_ids, half), kv[0], kv[1], kv_ids,
                            out[:, half:], lse[:, :, half:], self.config)
            return jnp.concatenate([jnp.zeros_like(dq), dq], axis=1), dkv

        return lax.cond(hop <= self.me, earlier, later, dout, query, q_ids, kv, kv_ids, out, lse)


def _first(ids, half):
    return None if ids is None else ids[:, :half]


def _second(ids, half):
    return None if ids is None else ids[:, half:]
