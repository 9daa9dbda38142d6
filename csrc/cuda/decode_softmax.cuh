// The online softmax the tensor-core split kernel (decode_split_rows.cuh) runs per warp over 16-key tiles, in the
// accumulator layout of mma.sync m16n8k16: lane (g, t) holds packed rows g and g + 8, and of each 8-key n-tile the
// keys 2t and 2t + 1.
#pragma once

#include <cmath>
#include <cstdint>

#include "decode_block.cuh"
#include "tensor_core/ptx.cuh"

namespace jax_flash::cuda_kernels::decode {

struct WarpSoftmax {
  float logit_scale;  // folds log2(e) in unless softcap applies it after the tanh
  AttentionMask mask;
  int position_low, position_high;  // positions of rows g and g + 8
  int t;
  float max_low = -INFINITY, max_high = -INFINITY;  // base 2
  float sum_low = 0.f, sum_high = 0.f;              // this lane's part until reduce_sums

  __device__ WarpSoftmax(const DecodeParams& p, int position_low_, int position_high_, int lane)
      : logit_scale(p.mask.softcap > 0.f ? p.scale : p.scale * kLog2e),
        mask(p.mask),
        position_low(position_low_),
        position_high(position_high_),
        t(lane % 4) {}

  // s[n][e] holds Q K^T of row g (e < 2) or g + 8 and key j0 + 8n + 2t + e % 2. Masks keys at or past key_end and
  // outside a row's window when `masked`, replaces s by 2^(logit - running max) and returns the factors (rows g,
  // g + 8) by which the output accumulated so far must be rescaled.
  __device__ __forceinline__ float2 update(float (&s)[2][4], int j0, bool masked, int key_end) {
    // Both conditions hold for the whole warp, so each is one branch per tile around its unrolled loop.
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] *= logit_scale;
    if (mask.softcap > 0.f) {
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] = capped_logit(s[n][e], mask.softcap) * kLog2e;
    }
    if (masked) {
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = j0 + 8 * n + 2 * t + e % 2;
          if (key >= key_end || !key_visible(mask, e < 2 ? position_low : position_high, key)) s[n][e] = -INFINITY;
        }
    }
    // The max is reduced over the 4 lanes of a row once per tile, not per key.
    float tile_low = fmaxf(fmaxf(s[0][0], s[0][1]), fmaxf(s[1][0], s[1][1]));
    float tile_high = fmaxf(fmaxf(s[0][2], s[0][3]), fmaxf(s[1][2], s[1][3]));
#pragma unroll
    for (int offset = 1; offset < 4; offset *= 2) {
      tile_low = fmaxf(tile_low, __shfl_xor_sync(0xffffffffu, tile_low, offset));
      tile_high = fmaxf(tile_high, __shfl_xor_sync(0xffffffffu, tile_high, offset));
    }
    const float new_low = fmaxf(max_low, tile_low), new_high = fmaxf(max_high, tile_high);
    // With nothing visible yet the shift is 0, so exp2 of -inf stays 0 instead of becoming NaN.
    const float shift_low = new_low == -INFINITY ? 0.f : new_low, shift_high = new_high == -INFINITY ? 0.f : new_high;
    // The special-function unit's 2^x (exp2f adds denormal handling around it, three instructions per element):
    // results below 2^-126 of the running max flush to 0, far below what the fp16/bf16 output resolves.
    using tensor_core::exp2_fast;
    const float2 rescale = make_float2(exp2_fast(max_low - shift_low), exp2_fast(max_high - shift_high));
    max_low = new_low, max_high = new_high;
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = exp2_fast(s[n][e] - (e < 2 ? shift_low : shift_high));
    sum_low = fmaf(sum_low, rescale.x, s[0][0] + s[0][1] + s[1][0] + s[1][1]);
    sum_high = fmaf(sum_high, rescale.y, s[0][2] + s[0][3] + s[1][2] + s[1][3]);
    return rescale;
  }

  // Once the maxima settle they rarely move, and the whole warp then skips the rescale.
  __device__ __forceinline__ static bool any_moved(float2 rescale) {
    return __any_sync(0xffffffffu, rescale.x != 1.f || rescale.y != 1.f);
  }

  // Completes the row sums over the 4 lanes of each row.
  __device__ __forceinline__ void reduce_sums() {
#pragma unroll
    for (int offset = 1; offset < 4; offset *= 2) {
      sum_low += __shfl_xor_sync(0xffffffffu, sum_low, offset);
      sum_high += __shfl_xor_sync(0xffffffffu, sum_high, offset);
    }
  }

  // This warp's maxima and sums into the block's merge arrays [warps][16].
  __device__ __forceinline__ void store(float* state_max, float* state_sum, int warp, int g) const {
    if (t != 0) return;
    state_max[warp * 16 + g] = max_low, state_max[warp * 16 + g + 8] = max_high;
    state_sum[warp * 16 + g] = sum_low, state_sum[warp * 16 + g + 8] = sum_high;
  }
};

// The probabilities as the A operand of P V: the accumulator layout of the two n-tiles is the A layout of one
// 16-key k-step.
template <typename Element>
__device__ __forceinline__ uint4 probabilities_operand(const float (&s)[2][4]) {
  using tensor_core::pack_pair;
  return make_uint4(pack_pair<Element>(s[0][0], s[0][1]), pack_pair<Element>(s[0][2], s[0][3]),
                    pack_pair<Element>(s[1][0], s[1][1]), pack_pair<Element>(s[1][2], s[1][3]));
}

}  // namespace jax_flash::cuda_kernels::decode
