// What the standalone CUDA harnesses share: a CUDA-call check, and host-side values of the kernels' element types
// (a dtype's name, and a float stored as, or read back from, the dtype's bytes, so the host reference sees exactly
// what the device sees).
#pragma once

#include <cstddef>
#include <cstdio>
#include <cstdlib>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "attention_params.h"

// Stops the harness at the first failing CUDA call, naming it.
#define CHECK(x)                                                                    \
  do {                                                                              \
    cudaError_t e = (x);                                                            \
    if (e != cudaSuccess) {                                                         \
      printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e), __FILE__, __LINE__); \
      exit(1);                                                                      \
    }                                                                               \
  } while (0)

namespace harness {

using jax_flash::DType;

inline const char* name(DType t) { return t == DType::kFloat32 ? "f32" : t == DType::kFloat16 ? "f16" : "bf16"; }

inline size_t element_size(DType t) { return t == DType::kFloat32 ? 4 : 2; }

inline void store(DType t, float x, void* dst, size_t i) {
  if (t == DType::kFloat32) static_cast<float*>(dst)[i] = x;
  else if (t == DType::kFloat16) static_cast<__half*>(dst)[i] = __float2half(x);
  else static_cast<__nv_bfloat16*>(dst)[i] = __float2bfloat16(x);
}

inline float load(DType t, const void* src, size_t i) {
  if (t == DType::kFloat32) return static_cast<const float*>(src)[i];
  if (t == DType::kFloat16) return __half2float(static_cast<const __half*>(src)[i]);
  return __bfloat162float(static_cast<const __nv_bfloat16*>(src)[i]);
}

}  // namespace harness
