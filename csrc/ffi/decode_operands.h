// Operand lists of the decode and KV-cache-update custom calls and their validation, shared by every platform's
// handlers. Python validates first with friendlier messages; these checks keep a bad call from reaching a kernel.
// Both ops see the cache as a page pool with a page table (decode_params.h); Python passes a contiguous cache as
// the pool of one page per sequence.
#pragma once

#include <utility>

#include "../decode_params.h"
#include "attention_attrs.h"
#include "attention_operands.h"
#include "xla/ffi/api/ffi.h"

namespace jax_flash {

// decode(q, k_pool, v_pool, lengths, page_table) -> (out, lse); causal masking is implied (window_right = 0).
template <typename Binding>
auto bind_decode_operands(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::Buffer<ffi::S32>>()
      .template Arg<ffi::Buffer<ffi::S32>>()
      .template Ret<ffi::AnyBuffer>()
      .template Ret<ffi::Buffer<ffi::F32>>()
      .template Attrs<AttentionAttrs>();
}

// kv_cache_update(k_pool, v_pool, new_k, new_v, positions, page_table) -> (k_pool, v_pool), results aliasing the
// first two operands.
template <typename Binding>
auto bind_kv_cache_update_operands(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::Buffer<ffi::S32>>()
      .template Arg<ffi::Buffer<ffi::S32>>()
      .template Ret<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>();
}

ffi::Error decode_decode(const PlatformLimits& limits, const ffi::AnyBuffer& q, const ffi::AnyBuffer& k,
                         const ffi::AnyBuffer& v, const ffi::Buffer<ffi::S32>& lengths,
                         const ffi::Buffer<ffi::S32>& page_table, ffi::AnyBuffer& out, ffi::Buffer<ffi::F32>& lse,
                         const AttentionAttrs& attrs, DecodeParams* params);

ffi::Error decode_kv_cache_update(const PlatformLimits& limits, const ffi::AnyBuffer& k, const ffi::AnyBuffer& v,
                                  const ffi::AnyBuffer& new_k, const ffi::AnyBuffer& new_v,
                                  const ffi::Buffer<ffi::S32>& positions, const ffi::Buffer<ffi::S32>& page_table,
                                  ffi::AnyBuffer& k_out, ffi::AnyBuffer& v_out, KvCacheUpdateParams* params);

}  // namespace jax_flash
