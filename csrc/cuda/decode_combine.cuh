// The second step of a split decode: merges the splits' normalised partial outputs into the output and the lse.
#pragma once

#include <cmath>
#include <cstdint>

#include "decode_block.cuh"

namespace jax_flash::cuda_kernels::decode {

constexpr int kCombineThreads = 128;

// One block per output row: weights 2^(lse_s - max) over the splits' normalised partials.
template <typename Element>
__global__ void __launch_bounds__(kCombineThreads) decode_combine_kernel(DecodeParams p, int splits, Partials parts) {
  const int64_t row = blockIdx.x, rows_out = p.batch * p.q_len * p.heads_q, d = p.cache.head_dim;
  float max_all = -INFINITY;
  for (int s = 0; s < splits; ++s) max_all = fmaxf(max_all, parts.lse[s * rows_out + row]);
  const float shift = max_all == -INFINITY ? 0.f : max_all;
  float total = 0.f;
  for (int s = 0; s < splits; ++s) total += exp2f(parts.lse[s * rows_out + row] - shift);
  const float inverse = total > 0.f ? 1.f / total : 0.f;
  for (int64_t col = threadIdx.x; col < d; col += kCombineThreads) {
    float acc = 0.f;
    for (int s = 0; s < splits; ++s) {
      const float weight = exp2f(parts.lse[s * rows_out + row] - shift);
      if (weight > 0.f) acc = fmaf(weight, parts.o[(s * rows_out + row) * d + col], acc);
    }
    store_float(acc * inverse, static_cast<Element*>(p.out) + row * d + col);
  }
  if (threadIdx.x == 0) {
    // out rows are [b, i, h]; lse is [b, h, i].
    const int64_t h = row % p.heads_q, i = (row / p.heads_q) % p.q_len, b = row / (p.heads_q * p.q_len);
    p.lse[(b * p.heads_q + h) * p.q_len + i] = total > 0.f ? (max_all + log2f(total)) * kLn2 : -INFINITY;
  }
}

}  // namespace jax_flash::cuda_kernels::decode
