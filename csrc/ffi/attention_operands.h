// Operand lists of the attention custom calls and their validation, shared by every platform's handlers.
// Python validates first with friendlier messages; these checks are the backstop that keeps a bad call from
// reaching a kernel.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "../attention_params.h"
#include "attention_attrs.h"
#include "operand_checks.h"
#include "xla/ffi/api/ffi.h"

namespace jax_flash {

// The forward's outputs and attributes, after its operands; taken by reference because a binding cannot be moved
// into a parameter (XLA's Binding only builds on itself through its member functions).
template <typename Binding>
auto bind_forward_results(Binding&& binding) {
  return std::move(binding)
      .RemainingArgs()
      .template Ret<ffi::AnyBuffer>()
      .template Ret<ffi::Buffer<ffi::F32>>()
      .template Attrs<AttentionAttrs>();
}

// forward(q, k, v, <token-mask operands>) -> (out, lse); the token-mask operands (TokenInput, attention_attrs.h)
// arrive as the remaining arguments and are decoded by decode_forward. With kDescale (the FP8 forward) a float32
// descale operand {query_scale * key_scale, value_scale} follows v: e4m3 q, k, v and a bfloat16 out.
template <bool kDescale = false, typename Binding>
auto bind_forward_operands(Binding binding) {
  auto qkv = std::move(binding)
                 .template Arg<ffi::AnyBuffer>()
                 .template Arg<ffi::AnyBuffer>()
                 .template Arg<ffi::AnyBuffer>();
  if constexpr (kDescale) {
    return bind_forward_results(std::move(qkv).template Arg<ffi::Buffer<ffi::F32>>());
  } else {
    return bind_forward_results(std::move(qkv));
  }
}

// backward(dout, q, k, v, out, lse, <token-mask operands>) -> (dq, dk, dv)
template <typename Binding>
auto bind_backward_operands(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::Buffer<ffi::F32>>()
      .RemainingArgs()
      .template Ret<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Attrs<AttentionAttrs>();
}

// Validate the operands (shapes, dtypes, platform limits) and fill the kernel params, tokens included.
ffi::Error decode_forward(const PlatformLimits& limits, const ffi::AnyBuffer& q, const ffi::AnyBuffer& k,
                          const ffi::AnyBuffer& v, const ffi::RemainingArgs& tokens, ffi::AnyBuffer& out,
                          ffi::Buffer<ffi::F32>& lse, const AttentionAttrs& attrs, AttentionForwardParams* params);

ffi::Error decode_fp8_forward(const PlatformLimits& limits, const ffi::AnyBuffer& q, const ffi::AnyBuffer& k,
                              const ffi::AnyBuffer& v, const ffi::Buffer<ffi::F32>& descale,
                              const ffi::RemainingArgs& tokens, ffi::AnyBuffer& out, ffi::Buffer<ffi::F32>& lse,
                              const AttentionAttrs& attrs, AttentionForwardParams* params);

ffi::Error decode_backward(const PlatformLimits& limits, const ffi::AnyBuffer& dout, const ffi::AnyBuffer& q,
                           const ffi::AnyBuffer& k, const ffi::AnyBuffer& v, const ffi::AnyBuffer& out,
                           const ffi::Buffer<ffi::F32>& lse, const ffi::RemainingArgs& tokens, ffi::AnyBuffer& dq,
                           ffi::AnyBuffer& dk, ffi::AnyBuffer& dv, const AttentionAttrs& attrs,
                           AttentionBackwardParams* params);

}  // namespace jax_flash
