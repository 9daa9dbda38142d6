// 16-byte chunks of the stored element types, converted to and from the float32 the decode kernels compute in.
// (The attention kernels' dtype helpers are being rewritten alongside the tensor-core kernels; decode keeps its own
// few lines so that the two can change independently.)
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace jax_flash::cuda_kernels::decode {

template <typename Element>
struct Chunk {
  static constexpr int kElems = 16 / sizeof(Element);
};

// Reads 16 bytes through the read-only cache; `src` must be 16-byte aligned.
__device__ __forceinline__ uint4 load_chunk(const void* src) { return __ldg(static_cast<const uint4*>(src)); }

__device__ __forceinline__ void chunk_to_float(const uint4& raw, float (&dst)[4]) {
  dst[0] = __uint_as_float(raw.x), dst[1] = __uint_as_float(raw.y);
  dst[2] = __uint_as_float(raw.z), dst[3] = __uint_as_float(raw.w);
}

__device__ __forceinline__ void chunk_to_float(const uint4& raw, float (&dst)[8], __half) {
  const __half2* pairs = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 pair = __half22float2(pairs[i]);
    dst[2 * i] = pair.x, dst[2 * i + 1] = pair.y;
  }
}

__device__ __forceinline__ void chunk_to_float(const uint4& raw, float (&dst)[8], __nv_bfloat16) {
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 pair = __bfloat1622float2(pairs[i]);
    dst[2 * i] = pair.x, dst[2 * i + 1] = pair.y;
  }
}

// One interface for the three types: the element type picks the overload.
template <typename Element>
__device__ __forceinline__ void to_floats(const uint4& raw, float (&dst)[Chunk<Element>::kElems]) {
  if constexpr (sizeof(Element) == 4) {
    chunk_to_float(raw, dst);
  } else {
    chunk_to_float(raw, dst, Element{});
  }
}

__device__ __forceinline__ void store_float(float x, float* dst) { *dst = x; }
__device__ __forceinline__ void store_float(float x, __half* dst) { *dst = __float2half_rn(x); }
__device__ __forceinline__ void store_float(float x, __nv_bfloat16* dst) { *dst = __float2bfloat16_rn(x); }

}  // namespace jax_flash::cuda_kernels::decode
