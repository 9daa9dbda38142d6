// Element-type helpers of the decode kernels: 16-byte float32 chunks for the CUDA-core kernel, and float32 results
// stored as any of the three types. (The attention kernels' dtype helpers are being rewritten alongside the
// tensor-core kernels; decode keeps its own few lines so that the two can change independently.)
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace jax_flash::cuda_kernels::decode {

// Reads 16 bytes through the read-only cache; `src` must be 16-byte aligned.
__device__ __forceinline__ uint4 load_chunk(const void* src) { return __ldg(static_cast<const uint4*>(src)); }

__device__ __forceinline__ void chunk_to_float(const uint4& raw, float (&dst)[4]) {
  dst[0] = __uint_as_float(raw.x), dst[1] = __uint_as_float(raw.y);
  dst[2] = __uint_as_float(raw.z), dst[3] = __uint_as_float(raw.w);
}

__device__ __forceinline__ void store_float(float x, float* dst) { *dst = x; }
__device__ __forceinline__ void store_float(float x, __half* dst) { *dst = __float2half_rn(x); }
__device__ __forceinline__ void store_float(float x, __nv_bfloat16* dst) { *dst = __float2bfloat16_rn(x); }

}  // namespace jax_flash::cuda_kernels::decode
