"""Trace-time checks of the per-token mask arguments (sequence lengths, segment ids, segment positions), turning
them into the kernels' token-mask operands (jax_flash._config.TOKEN_INPUTS), each with a leading batch axis."""

from __future__ import annotations

import jax.numpy as jnp


def _int32_array(name: str, value, allowed: str):
    try:
        array = jnp.asarray(value)
    except TypeError as error:
        raise TypeError(f"{name} must be an int32 array {allowed}, got {type(value).__name__}") from error
    if array.dtype != jnp.int32:
        raise TypeError(f"{name} must have dtype int32, got {array.dtype} (convert it with .astype(jnp.int32))")
    return array


def _lengths(name: str, value, batch: int, unbatched: bool):
    """query_seq_lengths / key_value_seq_lengths: [batch] int32 as in jax.nn ([1] for unbatched inputs)."""
    note = " (inputs without a batch axis count as batch 1, as in jax.nn)" if unbatched else ""
    array = _int32_array(name, value, f"of shape [batch] = [{batch}]{note}")
    if array.shape != (batch,):
        raise ValueError(f"{name} must have shape [batch] = [{batch}]{note}, got {array.shape}")
    return array


def _pair(name: str, value, batch: int, seq_q: int, seq_k: int, unbatched: bool):
    """segment_ids / segment_positions: one [batch, seq] array (needs seq_q == seq_k) or a (query, key/value) pair
    of [batch, seq_q] and [batch, seq_k]; without the batch axis for unbatched inputs."""
    lead = () if unbatched else (batch,)
    lead_text = "" if unbatched else "batch, "
    # Only a tuple is a pair: a nested list is one array written out, as jnp.asarray reads it.
    if isinstance(value, tuple):
        if len(value) != 2:
            raise ValueError(f"{name} must be one array or a (query, key_value) tuple, got a tuple of "
                             f"{len(value)} items")
        parts = [(f"{name}[0] (query)", value[0], seq_q), (f"{name}[1] (key/value)", value[1], seq_k)]
    else:
        if seq_q != seq_k:
            raise ValueError(f"a single {name} array needs seq_q == seq_k (self-attention), got seq_q={seq_q} and "
                             f"seq_k={seq_k}; pass a (query, key_value) pair of arrays instead")
        parts = [(name, value, seq_q)]
    arrays = []
    for part_name, part, seq in parts:
        expected = (*lead, seq)
        array = _int32_array(part_name, part, f"of shape [{lead_text}seq]")
        if array.shape != expected:
            raise ValueError(f"{part_name} must have shape [{lead_text}seq] = {list(expected)}, got {array.shape}")
        arrays.append(array if not unbatched else array[None])
    return arrays[0], arrays[-1]


def token_operands(query, key, *, query_seq_lengths, key_value_seq_lengths, segment_ids, segment_positions) -> dict:
    """{operand name: int32 array with a batch axis} for the arguments given, in TOKEN_INPUTS' order.

    query/key are the validated rank-3 or rank-4 inputs, before a batch axis is added.
    """
    unbatched = query.ndim == 3
    batch = 1 if unbatched else query.shape[0]
    seq_q, seq_k = query.shape[-3], key.shape[-3]
    operands = {}
    if query_seq_lengths is not None:
        operands["q_lengths"] = _lengths("query_seq_lengths", query_seq_lengths, batch, unbatched)
    if key_value_seq_lengths is not None:
        operands["kv_lengths"] = _lengths("key_value_seq_lengths", key_value_seq_lengths, batch, unbatched)
    if segment_ids is not None:
        operands["q_segment_ids"], operands["kv_segment_ids"] = _pair("segment_ids", segment_ids, batch, seq_q,
                                                                      seq_k, unbatched)
    if segment_positions is not None:
        operands["q_positions"], operands["kv_positions"] = _pair("segment_positions", segment_positions, batch,
                                                                  seq_q, seq_k, unbatched)
    return operands
