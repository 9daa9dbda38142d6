// Dense float32 building blocks of the CPU kernels, compiled for several x86 levels and chosen at load time.
#pragma once

#include <cstdint>

namespace jax_flash::cpu {

// C[m x n] += A[m x k] * B[k x n], all row-major with the given leading dimensions.
void gemm_accumulate(float* c, int64_t ldc, const float* a, int64_t lda, const float* b, int64_t ldb, int64_t m,
                     int64_t n, int64_t k);

// The same product, every element rounded the same way whatever its place in the tile (no fused multiply-adds), so
// two calls that multiply equal rows give equal results.
void gemm_accumulate_unfused(float* c, int64_t ldc, const float* a, int64_t lda, const float* b, int64_t ldb,
                             int64_t m, int64_t n, int64_t k);

// x[i] = exp(x[i] - shift) for i < n; returns the sum of the new values. x[i] = -inf gives 0.
float exp_shifted_sum(float* x, int64_t n, float shift);

// dst[n x m] = transpose(src[m x n]) with leading dimensions ld_src and ld_dst.
void transpose(const float* src, int64_t ld_src, int64_t m, int64_t n, float* dst, int64_t ld_dst);

}  // namespace jax_flash::cpu
