// Dense float32 and double building blocks of the CPU kernels, compiled for several x86 levels and chosen at load
// time.
#pragma once

#include <cstdint>

namespace jax_flash::cpu {

// C[m x n] += A[m x k] * B[k x n], all row-major with the given leading dimensions.
void gemm_accumulate(float* c, int64_t ldc, const float* a, int64_t lda, const float* b, int64_t ldb, int64_t m,
                     int64_t n, int64_t k);

// The same product in double. Products of float32 values are exact in double, so an element's result depends only
// on its operands and their order, never on fused multiply-adds or its place in the tile.
void gemm_accumulate(double* c, int64_t ldc, const double* a, int64_t lda, const double* b, int64_t ldb, int64_t m,
                     int64_t n, int64_t k);

// x[i] = exp(x[i] - shift) for i < n; returns the sum of the new values. x[i] = -inf gives 0.
float exp_shifted_sum(float* x, int64_t n, float shift);

// dst[n x m] = transpose(src[m x n]) with leading dimensions ld_src and ld_dst.
void transpose(const float* src, int64_t ld_src, int64_t m, int64_t n, float* dst, int64_t ld_dst);

}  // namespace jax_flash::cpu
