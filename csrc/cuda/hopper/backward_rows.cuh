// The per-query inputs of the Hopper backward, written once per call into the workspace, padded to a whole number
// of 128-row tiles so the TMA can load them in tiles (its strides must be multiples of 16 bytes):
//   lse_log2 = lse * log2(e), or +inf where the row has no gradient (a padding row, or a row that saw no key and
//              has lse = -inf), which makes every probability exp2(s - lse_log2) of that row 0;
//   delta    = dout . out (0 on padding rows).
#pragma once

#include <cmath>
#include <cstdint>

#include <cuda_runtime.h>

#include "../../attention_params.h"

namespace jax_flash::cuda_kernels::hopper {

constexpr int kRowPadding = 128;

inline int64_t padded_rows(int64_t seqlen_q) { return (seqlen_q + kRowPadding - 1) / kRowPadding * kRowPadding; }

inline size_t backward_rows_bytes(const AttentionShape& shape) {
  return 2 * sizeof(float) * size_t(shape.batch * shape.heads_q * padded_rows(shape.seqlen_q));
}

// A warp per (batch, head, padded row), 16-byte loads of dout and out across its lanes.
template <typename Element>
__global__ void backward_rows_kernel(AttentionBackwardParams p, int64_t padded, float* lse_log2, float* delta) {
  const int64_t warp = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  const AttentionShape& s = p.shape;
  if (warp >= s.batch * s.heads_q * padded) return;
  const int64_t row = warp % padded, head = warp / padded % s.heads_q, batch = warp / (padded * s.heads_q);
  float sum = 0.f;
  if (row < s.seqlen_q) {
    const int64_t offset = ((batch * s.seqlen_q + row) * s.heads_q + head) * s.head_dim;
    const auto* dout = static_cast<const Element*>(p.dout) + offset;
    const auto* out = static_cast<const Element*>(p.out) + offset;
    constexpr int kVector = 16 / sizeof(Element);
    for (int64_t d = lane * kVector; d < s.head_dim; d += 32 * kVector) {
      Element a[kVector], b[kVector];
      *reinterpret_cast<uint4*>(a) = *reinterpret_cast<const uint4*>(dout + d);
      *reinterpret_cast<uint4*>(b) = *reinterpret_cast<const uint4*>(out + d);
      for (int i = 0; i < kVector; ++i) sum += float(a[i]) * float(b[i]);
    }
  }
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (lane == 0) {
    const float lse = row < s.seqlen_q ? p.lse[(batch * s.heads_q + head) * s.seqlen_q + row] : -INFINITY;
    lse_log2[warp] = lse == -INFINITY ? INFINITY : lse * float(M_LOG2E);
    delta[warp] = sum;
  }
}

template <typename Element>
cudaError_t launch_backward_rows(const AttentionBackwardParams& p, float* lse_log2, float* delta,
                                 cudaStream_t stream) {
  const int64_t padded = padded_rows(p.shape.seqlen_q);
  const int64_t warps = p.shape.batch * p.shape.heads_q * padded;
  constexpr int kThreads = 256;
  const int64_t blocks = (warps * 32 + kThreads - 1) / kThreads;
  if (blocks == 0) return cudaSuccess;
  backward_rows_kernel<Element><<<unsigned(blocks), kThreads, 0, stream>>>(p, padded, lse_log2, delta);
  return cudaGetLastError();
}

}  // namespace jax_flash::cuda_kernels::hopper
