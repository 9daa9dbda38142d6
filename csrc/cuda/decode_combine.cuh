// The second step of a split decode: merges the splits' normalised partial outputs into the output and the lse.
#pragma once

#include <cmath>
#include <cstdint>

#include "decode_block.cuh"

namespace jax_flash::cuda_kernels::decode {

constexpr int kCombineWarps = 8;
constexpr int kCombineThreads = 32 * kCombineWarps;
constexpr int kMaxSplits = 128;  // at most one split per combine thread
static_assert(kMaxSplits <= kCombineThreads, "the combine weighs one split per thread");

// x reduced with op over the block, in a fixed order (so the result is deterministic). `scratch` holds one value
// per warp.
template <typename Op>
__device__ __forceinline__ float combine_block_reduce(float x, Op op, float* scratch) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x = op(x, __shfl_xor_sync(0xffffffffu, x, offset));
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = x;
  __syncthreads();
  float all = scratch[0];
#pragma unroll
  for (int w = 1; w < kCombineWarps; ++w) all = op(all, scratch[w]);
  __syncthreads();  // scratch is reused
  return all;
}

// One block per output row. The splits' weights 2^(lse_s - max) / sum are computed once, one split per thread; then
// warp w sums splits w, w + kCombineWarps, ... with 16-byte loads of 4 columns per lane (independent loads, many in
// flight: the partials of one row are few and latency, not bandwidth, bounds this kernel), and the warps' sums are
// added in warp order. Deterministic.
template <typename Element>
__global__ void __launch_bounds__(kCombineThreads) decode_combine_kernel(DecodeParams p, int splits, Partials parts) {
  __shared__ float scratch[kCombineWarps];
  __shared__ float weight[kCombineThreads];
  __shared__ float4 warp_sums[kCombineWarps][32];
  wait_for_prerequisite_grids();  // the split kernel's partials, when launched as its programmatic dependent
  const int64_t row = blockIdx.x, rows_out = p.batch * p.q_len * p.heads_q, d = p.cache.head_dim;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  const float lse = static_cast<int>(threadIdx.x) < splits ? parts.lse[threadIdx.x * rows_out + row] : -INFINITY;
  // A NaN partial (a NaN among its visible entries) makes the maximum NaN, and with it the row's output and lse.
  const float max_all = combine_block_reduce(lse, [](float a, float b) { return nan_max(a, b); }, scratch);
  // With nothing visible anywhere the shift is 0, so exp2 of -inf stays 0 instead of becoming NaN.
  const float unnormalised = exp2f(lse - (max_all == -INFINITY ? 0.f : max_all));
  const float total = combine_block_reduce(unnormalised, [](float a, float b) { return a + b; }, scratch);
  weight[threadIdx.x] = total == 0.f ? 0.f : unnormalised / total;
  __syncthreads();

  for (int64_t col0 = 0; col0 < d; col0 += 4 * 32) {
    const int64_t col = col0 + 4 * lane;  // head_dim is a multiple of 8: a lane's 4 columns are all in or all out
    float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
    if (col < d) {
#pragma unroll 4
      for (int s = warp; s < splits; s += kCombineWarps) {
        const float w = weight[s];
        if (w == 0.f) continue;  // an empty split (or one far below the max): its partial need not be read
        const float4 x = *reinterpret_cast<const float4*>(parts.o + (s * rows_out + row) * d + col);
        sum.x = fmaf(w, x.x, sum.x), sum.y = fmaf(w, x.y, sum.y), sum.z = fmaf(w, x.z, sum.z),
        sum.w = fmaf(w, x.w, sum.w);
      }
    }
    warp_sums[warp][lane] = sum;
    __syncthreads();
    if (warp == 0 && col < d) {
      float4 all = warp_sums[0][lane];
#pragma unroll
      for (int w = 1; w < kCombineWarps; ++w)
        all.x += warp_sums[w][lane].x, all.y += warp_sums[w][lane].y, all.z += warp_sums[w][lane].z,
            all.w += warp_sums[w][lane].w;
      Element* out = static_cast<Element*>(p.out) + row * d + col;
      store_float(all.x, out), store_float(all.y, out + 1), store_float(all.z, out + 2), store_float(all.w, out + 3);
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    // out rows are [b, i, h]; lse is [b, h, i].
    const int64_t h = row % p.heads_q, i = (row / p.heads_q) % p.q_len, b = row / (p.heads_q * p.q_len);
    p.lse[(b * p.heads_q + h) * p.q_len + i] = total == 0.f ? -INFINITY : (max_all + log2f(total)) * kLn2;
  }
}

}  // namespace jax_flash::cuda_kernels::decode
