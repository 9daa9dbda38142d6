// From a raw q.k product to the logit the softmax sees, in base 2: the kernels use exp2 on the special-function
// unit, so log2(e) is folded into the scale once instead of multiplying every logit.
#pragma once

#include <cmath>

#include "ptx.cuh"

namespace jax_flash::cuda_kernels::tensor_core {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

struct Logit {
  float log2_value;  // capped(scale * qk) * log2(e)
  float slope;       // d capped / d (scale * qk): 1 - tanh^2 under a softcap, 1 without
};

class LogitTransform {
 public:
  __device__ __forceinline__ LogitTransform(float scale, float softcap)
      : capped_(softcap > 0.f),
        scale_log2_(scale * kLog2e),
        scale_over_cap_(softcap > 0.f ? scale / softcap : 0.f),
        cap_log2_(softcap * kLog2e) {}

  // Every entry of an accumulator of raw q.k products becomes its logit. The softcap test is outside the loop, so
  // uncapped calls pay one multiply per entry and never a tanh.
  template <int kM, int kN>
  __device__ __forceinline__ void apply(float (&acc)[kM][kN][4]) const {
    if (capped_) {
#pragma unroll
      for (int m = 0; m < kM; ++m)
#pragma unroll
        for (int n = 0; n < kN; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[m][n][e] = cap_log2_ * tanh_fast(acc[m][n][e] * scale_over_cap_);
    } else {
#pragma unroll
      for (int m = 0; m < kM; ++m)
#pragma unroll
        for (int n = 0; n < kN; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[m][n][e] *= scale_log2_;
    }
  }

  __device__ __forceinline__ bool capped() const { return capped_; }

  // One entry's logit and slope; kCapped must equal capped(), so loops can pick their variant once, outside.
  template <bool kCapped>
  __device__ __forceinline__ Logit with_slope(float qk) const {
    if constexpr (!kCapped) {
      return {qk * scale_log2_, 1.f};
    } else {
      const float t = tanh_fast(qk * scale_over_cap_);
      return {cap_log2_ * t, 1.f - t * t};
    }
  }

 private:
  bool capped_;
  float scale_log2_;
  float scale_over_cap_;
  float cap_log2_;
};

// A row's lse in base 2 as the backward uses it: exp2(logit - lse) is the probability, and rows that saw no key
// (lse = -inf) or lie past the sequence get +inf, so every probability of theirs is exactly 0.
__device__ __forceinline__ float backward_lse_log2(bool row_valid, float lse) {
  return row_valid && lse != -INFINITY ? lse * kLog2e : INFINITY;
}

}  // namespace jax_flash::cuda_kernels::tensor_core
