// The tensor-core backward's non-deterministic dQ (as FlashAttention-2 computes it): the dk/dv kernel, which already
// forms dS for each (key block, query block) pair, also multiplies it by the block's K and adds the product into a
// float32 sum of dQ with atomics, so the dq kernel's second computation of S and dP (two of seven products) is
// skipped. The sum is [batch, seqlen_q, heads_q, head_dim] in the workspace after delta, zeroed on the stream; a
// last kernel scales it by the softmax scale and rounds it into dq. The atomics add in an order that varies from run
// to run, so calls asking for determinism keep the two-kernel backward.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "../../attention_params.h"
#include "tensor_core.h"  // fuses_query_gradient and the sum's place in the workspace
#include "warp_mma.cuh"

namespace jax_flash::cuda_kernels::tensor_core {

// The warp's dS^T rows (16 keys from key_row, as the A operand of dK += dS^T q) into `tile`, keys x queries, where
// every warp of the block can read them back.
template <int kKSteps, typename Tile>
__device__ __forceinline__ void store_score_gradients(const uint32_t (&ds)[1][kKSteps][4], const Tile& tile,
                                                      int key_row) {
  const int lane = lane_index(), row = key_row + lane / 4, column = lane % 4 * 2;
  auto at = [&](int r, int c) { return reinterpret_cast<uint32_t*>(tile.data + r * Tile::kPitch + c); };
#pragma unroll
  for (int k = 0; k < kKSteps; ++k) {
    *at(row, 16 * k + column) = ds[0][k][0];
    *at(row + 8, 16 * k + column) = ds[0][k][1];
    *at(row, 16 * k + 8 + column) = ds[0][k][2];
    *at(row + 8, 16 * k + 8 + column) = ds[0][k][3];
  }
}

// sum += dS K for one block pair: dS^T (kBlockN keys x kBlockM queries) in `score_gradients`, K (kBlockN keys x
// kHeadDim) in `k_tile`. The block's warps take the kBlockM x kHeadDim product's 16 x 16 units in turn (a warp's
// units share their query rows, so kWarps must be a multiple of the query tiles). Row r of the sum starts at
// sum + r * row_stride; rows past `rows` and columns past head_dim are not added.
template <typename Element, int kWarps, int kBlockM, int kBlockN, int kHeadDim, typename ScoreTile, typename KeyTile>
__device__ __forceinline__ void add_query_gradient(const ScoreTile& score_gradients, const KeyTile& k_tile,
                                                   float* sum, int64_t row_stride, int rows, int head_dim) {
  constexpr int kQueryTiles = kBlockM / 16, kUnits = kQueryTiles * (kHeadDim / 16);
  static_assert(kWarps % kQueryTiles == 0, "a warp's units keep one query tile");
  const int lane = lane_index(), warp = static_cast<int>(threadIdx.x) / 32, m = warp % kQueryTiles;
#pragma unroll
  for (int round = 0; round < (kUnits + kWarps - 1) / kWarps; ++round) {
    const int unit = warp + round * kWarps;
    if (kUnits % kWarps != 0 && unit >= kUnits) break;
    const int pair = unit / kQueryTiles;  // 16 columns of the head dim
    float acc[2][4] = {};
#pragma unroll
    for (int k = 0; k < kBlockN / 16; ++k) {
      // The A operand, dS (queries x keys), is read transposed out of dS^T, as is K for the B operand; A is loaded
      // again per unit, since keeping all of its steps in registers made the dk/dv kernel spill.
      uint32_t a[4], b[4];
      ldmatrix_x4_trans(a, score_gradients.address(16 * k + lane / 16 * 8 + lane % 8, 16 * m + lane / 8 % 2 * 8));
      ldmatrix_x4_trans(b, k_tile.address(16 * k + lane / 8 % 2 * 8 + lane % 8, 16 * pair + lane / 16 * 8));
      mma_16816<Element>(acc[0], a, b[0], b[1]);
      mma_16816<Element>(acc[1], a, b[2], b[3]);
    }
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = 16 * m + lane / 4 + e / 2 * 8, column = 16 * pair + 8 * n + lane % 4 * 2 + e % 2;
        if (row < rows && column < head_dim) atomicAdd(sum + row * row_stride + column, acc[n][e]);
      }
  }
}

// dq = scale * sum, both [batch, seqlen_q, heads_q, head_dim] contiguous, two elements per thread and step.
template <typename Element>
__global__ void round_query_gradient_kernel(const float2* sum, uint32_t* dq, int64_t pairs, float scale) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < pairs; i += int64_t(gridDim.x) * blockDim.x) {
    const float2 value = sum[i];
    dq[i] = pack_pair<Element>(value.x * scale, value.y * scale);
  }
}

template <typename Element>
cudaError_t launch_round_query_gradient(const float* sum, void* dq, const AttentionShape& s, float scale,
                                        cudaStream_t stream) {
  const int64_t pairs = s.batch * s.seqlen_q * s.heads_q * s.head_dim / 2;  // head_dim is a multiple of 8
  if (pairs == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const int64_t blocks = (pairs + kThreads - 1) / kThreads;
  round_query_gradient_kernel<Element><<<unsigned(blocks < 65536 ? blocks : 65536), kThreads, 0, stream>>>(
      reinterpret_cast<const float2*>(sum), static_cast<uint32_t*>(dq), pairs, scale);
  return cudaGetLastError();
}

}  // namespace jax_flash::cuda_kernels::tensor_core
