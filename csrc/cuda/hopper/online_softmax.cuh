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

// kMaxLagLog2: how far (in log2 units) a row's maximum may rise before the warp moves to it. Until then the
// exponentials are taken against the old maximum (each at most 2^kMaxLagLog2, well inside 16-bit range) and what was
// accumulated needs no rescale, so key tiles where no row of a warp moved far skip the output rows' rescale (one FMUL
// per output element and key tile). That pays where the output accumulator is largest (head dim 256); at smaller
// head dims the warp vote and branch cost more than they save, and 0 keeps the exact form: every row moves to its
// new maximum and the caller always rescales.
template <int kRows, int kMaxLagLog2>
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

  // Turns `scores` into unnormalised probabilities against the (possibly moved) row maxima and adds them to row_sum.
  // Returns whether the output rows need rescaling (always with kMaxLagLog2 == 0; otherwise only when the warp's
  // maxima moved, the same answer in every lane), and then `rescale` holds the factor per row.
  template <class Scores>
  __device__ __forceinline__ bool update(Scores& scores, float (&rescale)[kRows]) {
    static_assert(decltype(cute::size<0>(scores))::value == kRows);
    if constexpr (kMaxLagLog2 == 0) {
      update_exact(scores, rescale);
      return true;
    } else {
      return update_lagging(scores, rescale);
    }
  }

 private:
  template <class Scores>
  __device__ __forceinline__ void update_exact(Scores& scores, float (&rescale)[kRows]) {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const float new_max = tile_max(scores, r);
      const float base = log2_base(new_max);
      rescale[r] = tensor_core::exp2_fast(row_max[r] * scale_log2 - base);
      row_max[r] = new_max;
      row_sum[r] = row_sum[r] * rescale[r] + exponentiate(scores, r, base);
    }
  }

  template <class Scores>
  __device__ __forceinline__ bool update_lagging(Scores& scores, float (&rescale)[kRows]) {
    float new_max[kRows];
    bool rises = false;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      new_max[r] = tile_max(scores, r);
      // From -inf (no visible key yet) any finite maximum rises; -inf to -inf (NaN) does not.
      rises |= (new_max[r] - row_max[r]) * scale_log2 > float(kMaxLagLog2);
    }
    const bool moves = __any_sync(0xffffffffu, rises);
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      if (moves) {
        const float base = log2_base(new_max[r]);
        rescale[r] = tensor_core::exp2_fast(row_max[r] * scale_log2 - base);
        row_max[r] = new_max[r];
        row_sum[r] *= rescale[r];
      }
      const float base = log2_base(row_max[r]);
      row_sum[r] += exponentiate(scores, r, base);
    }
    return moves;
  }

  // Row r's maximum over row_max and this tile, reduced over the row's quad.
  template <class Scores>
  __device__ __forceinline__ float tile_max(const Scores& scores, int r) const {
    float new_max = row_max[r];
    CUTE_UNROLL
    for (int c = 0; c < cute::size<1>(scores); ++c) new_max = fmaxf(new_max, scores(r, c));
    return quad_max(new_max);
  }

  // A maximum in log2 units. A row with no visible key yet keeps every probability exp2(-inf) = 0 rather than NaN
  // from -inf - -inf.
  __device__ __forceinline__ float log2_base(float max) const { return max == -INFINITY ? 0.f : max * scale_log2; }

  // Row r's scores -> exp2(score * scale_log2 - base), in place; returns their sum.
  template <class Scores>
  __device__ __forceinline__ float exponentiate(Scores& scores, int r, float base) const {
    float sum = 0.f;
    CUTE_UNROLL
    for (int c = 0; c < cute::size<1>(scores); ++c) {
      scores(r, c) = tensor_core::exp2_fast(fmaf(scores(r, c), scale_log2, -base));
      sum += scores(r, c);
    }
    return sum;
  }

 public:
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
