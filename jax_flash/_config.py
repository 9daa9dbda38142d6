"""The static configuration of one attention call, and the FFI attributes it becomes (the same on every platform)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

# The token-mask operands of the attention kernels, in their FFI order (TokenInput in csrc/ffi/attention_attrs.h):
# name -> the public argument it comes from.
TOKEN_INPUTS = {
    "q_lengths": "query_seq_lengths",
    "kv_lengths": "key_value_seq_lengths",
    "q_segment_ids": "segment_ids",
    "kv_segment_ids": "segment_ids",
    "q_positions": "segment_positions",
    "kv_positions": "segment_positions",
}


class AttentionConfig(NamedTuple):
    """Hashable, so it can be a primitive parameter and a custom_vjp non-differentiable argument.

    Query i sees key j when i - window_left <= j <= i + window_right; -1 means unbounded on that side, and causal
    masking (jax.nn's top-left-aligned is_causal) is window_right = 0. softcap <= 0 means no soft-capping.
    token_inputs names the token-mask operands (keys of TOKEN_INPUTS, in that order) that follow the attention
    operands of the primitives.
    """

    scale: float
    window_left: int = -1
    window_right: int = -1
    softcap: float = 0.0
    token_inputs: tuple[str, ...] = ()
    deterministic: bool = True  # backward: bitwise-identical gradients run to run (the fused CUDA dQ sum is not)

    def ffi_attributes(self) -> dict:
        # Names and types must match AttentionAttrs in csrc/ffi/attention_attrs.h, which the decode kernels share
        # (their calls have no token-mask operands, so mask_inputs is 0 there). Bit k of mask_inputs is set when the
        # k-th operand of TOKEN_INPUTS is present.
        return dict(
            scale=np.float32(self.scale),
            window_left=np.int64(self.window_left),
            window_right=np.int64(self.window_right),
            softcap=np.float32(self.softcap),
            mask_inputs=np.int64(sum(1 << k for k, name in enumerate(TOKEN_INPUTS) if name in self.token_inputs)),
            deterministic=np.int64(self.deterministic),
        )
