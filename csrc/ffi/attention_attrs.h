// The attributes of the attention custom calls: one definition used by the CPU and the CUDA handlers. Python sends
// the same names (jax_flash/_lowering.py); causal masking arrives as window_right = 0.
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
};

inline AttentionMask to_mask(const AttentionAttrs& attrs) {
  return AttentionMask{attrs.window_left, attrs.window_right, attrs.softcap};
}

}  // namespace jax_flash

XLA_FFI_REGISTER_STRUCT_ATTR_DECODING(jax_flash::AttentionAttrs, ::xla::ffi::StructMember<float>("scale"),
                                      ::xla::ffi::StructMember<int64_t>("window_left"),
                                      ::xla::ffi::StructMember<int64_t>("window_right"),
                                      ::xla::ffi::StructMember<float>("softcap"));
