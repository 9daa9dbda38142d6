// Conversions between the tensor element types (float, half, bfloat16) and the float32 the kernels compute in.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace jax_flash::cuda_kernels {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename Element>
__device__ __forceinline__ Element from_float(float x);

template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}

template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}

template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Eight consecutive elements as floats, read with 16-byte loads; `src` must be 16-byte aligned. Rows of a tensor
// whose head_dim is a multiple of 8 start on such a boundary when the tensor itself does.
__device__ __forceinline__ void load8_as_float(const float* src, float (&dst)[8]) {
  const float4 low = *reinterpret_cast<const float4*>(src);
  const float4 high = *reinterpret_cast<const float4*>(src + 4);
  dst[0] = low.x, dst[1] = low.y, dst[2] = low.z, dst[3] = low.w;
  dst[4] = high.x, dst[5] = high.y, dst[6] = high.z, dst[7] = high.w;
}

__device__ __forceinline__ void load8_as_float(const __half* src, float (&dst)[8]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(src);
  const __half2* pairs = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 pair = __half22float2(pairs[i]);
    dst[2 * i] = pair.x, dst[2 * i + 1] = pair.y;
  }
}

__device__ __forceinline__ void load8_as_float(const __nv_bfloat16* src, float (&dst)[8]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(src);
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 pair = __bfloat1622float2(pairs[i]);
    dst[2 * i] = pair.x, dst[2 * i + 1] = pair.y;
  }
}

}  // namespace jax_flash::cuda_kernels
