// The running softmax of one thread's query rows across key tiles, on the (rows, columns) view of a wgmma
// accumulator (warpgroup_gemm.cuh). Scores arrive raw (q.k, or soft-capped); exp2 with the scale folded in keeps
// one FFMA + one MUFU per element.
#pragma once

#include <cmath>

#include <cute/tensor.hpp>

#include "../tensor_core/ptx.cuh"  // exp2_fast: one MUFU.EX2, no range fix-ups

namespace jax_flash::cuda_kernels::hopper {

// Each row is shared by the 4 threads of a quad (consecutive lanes).
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

template <int kRows>
struct OnlineSoftmax {
  float scale_log2;     // multiplies a raw score into log2 units
  float row_max[kRows];  // raw units; -inf while a row has seen no visible key
  float row_sum[kRows];  // this thread's share of the row's sum of exp, relative to row_max

  __device__ explicit OnlineSoftmax(float scale_log2_) : scale_log2(scale_log2_) {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      row_max[r] = -INFINITY;
      row_sum[r] = 0.f;
    }
  }

  // Turns `scores` into unnormalised probabilities against the updated row maxima and returns, per row, the factor
  // that rescales what was accumulated against the old maxima (the output rows and row_sum).
  template <class Scores>
  __device__ __forceinline__ void update(Scores& scores, float (&rescale)[kRows]) {
    static_assert(decltype(cute::size<0>(scores))::value == kRows);
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      float new_max = row_max[r];
      CUTE_UNROLL
      for (int c = 0; c < cute::size<1>(scores); ++c) new_max = fmaxf(new_max, scores(r, c));
      new_max = quad_max(new_max);
      // A row with no visible key yet keeps every probability exp2(-inf) = 0 rather than NaN from -inf - -inf.
      const float base = new_max == -INFINITY ? 0.f : new_max * scale_log2;
      rescale[r] = tensor_core::exp2_fast(row_max[r] * scale_log2 - base);
      row_max[r] = new_max;
      float sum = 0.f;
      CUTE_UNROLL
      for (int c = 0; c < cute::size<1>(scores); ++c) {
        scores(r, c) = tensor_core::exp2_fast(fmaf(scores(r, c), scale_log2, -base));
        sum += scores(r, c);
      }
      row_sum[r] = row_sum[r] * rescale[r] + sum;
    }
  }

  // 1 / sum per row (0 for a row that saw no key, so its output is 0) and the natural-log sum of exp.
  __device__ __forceinline__ void finish(float (&inverse_sum)[kRows], float (&lse)[kRows]) {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const float sum = quad_sum(row_sum[r]);
      const bool empty = sum == 0.f;
      inverse_sum[r] = empty ? 0.f : 1.f / sum;
      lse[r] = empty ? -INFINITY : (row_max[r] * scale_log2 + log2f(sum)) * float(M_LN2);
    }
  }
};

}  // namespace jax_flash::cuda_kernels::hopper
