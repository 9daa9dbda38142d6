"""The static configuration of one attention call, and the FFI attributes it becomes (the same on every platform)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class AttentionConfig(NamedTuple):
    """Hashable, so it can be a primitive parameter and a custom_vjp non-differentiable argument.

    Query i sees key j when i - window_left <= j <= i + window_right; -1 means unbounded on that side, and causal
    masking (jax.nn's top-left-aligned is_causal) is window_right = 0. softcap <= 0 means no soft-capping.
    """

    scale: float
    window_left: int = -1
    window_right: int = -1
    softcap: float = 0.0

    def ffi_attributes(self) -> dict:
        # Names and types must match AttentionAttrs in csrc/ffi/attention_attrs.h.
        return dict(
            scale=np.float32(self.scale),
            window_left=np.int64(self.window_left),
            window_right=np.int64(self.window_right),
            softcap=np.float32(self.softcap),
        )
