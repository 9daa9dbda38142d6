// The attributes of the attention custom calls: one definition used by the CPU and the CUDA handlers. Python sends
// the same names (jax_flash/_partitioning.py); causal masking arrives as window_right = 0.
#pragma once

#include <cstdint>

#include "../attention_params.h"
#include "xla/ffi/api/ffi.h"

namespace jax_flash {

struct AttentionAttrs {
  float scale;
  int64_t window_left;   // < 0: unbounded
  int64_t window_right;  // < 0: unbounded
  float softcap;         // <= 0: off
  int64_t mask_inputs;   // which token-mask operands are present, a set of TokenInput bits (0 for decode)
  int64_t deterministic; // backward: nonzero asks for bitwise-identical gradients run to run
};

// The token-mask operands that follow q, k, v (forward) or dout, q, k, v, out, lse (backward), in this order, each
// int32. Every call passes all of them; an absent one is a zero-size placeholder and its bit in mask_inputs is clear,
// so each op keeps one FFI target per platform. Python's list is jax_flash/_config.py's TOKEN_INPUTS.
enum TokenInput : int64_t {
  kQueryLengths = 1 << 0,      // [batch]
  kKeyValueLengths = 1 << 1,   // [batch]
  kQuerySegmentIds = 1 << 2,   // [batch, seq_q]
  kKeyValueSegmentIds = 1 << 3,  // [batch, seq_k]
  kQueryPositions = 1 << 4,    // [batch, seq_q]
  kKeyValuePositions = 1 << 5,   // [batch, seq_k]
};
inline constexpr int kTokenInputCount = 6;

inline AttentionMask to_mask(const AttentionAttrs& attrs) {
  return AttentionMask{attrs.window_left, attrs.window_right, attrs.softcap};
}

}  // namespace jax_flash

XLA_FFI_REGISTER_STRUCT_ATTR_DECODING(jax_flash::AttentionAttrs, ::xla::ffi::StructMember<float>("scale"),
                                      ::xla::ffi::StructMember<int64_t>("window_left"),
                                      ::xla::ffi::StructMember<int64_t>("window_right"),
                                      ::xla::ffi::StructMember<float>("softcap"),
                                      ::xla::ffi::StructMember<int64_t>("mask_inputs"),
                                      ::xla::ffi::StructMember<int64_t>("deterministic"));
