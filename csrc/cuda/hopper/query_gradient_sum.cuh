// The fused Hopper backward's dQ (backward_kernel.cuh, role kFused): a float32 sum in the workspace after the
// per-row inputs, zeroed on the stream. It is tiled like the key-major kernel's streamed query tiles: one block of
// kSumTileRows rows x sum_row_stride(head_dim) floats per (batch, query head, query tile), rows padded by
// kSumRowPad floats so that the consumers' column-pair stores into the shared-memory copy of a block hit every bank
// once. Per streamed tile the consumers write their dQ = dS K block to shared memory, and one producer-side warp
// adds it to the sum with a bulk reduce-add (add_query_gradient_tiles), off the consumers' path. A last kernel
// scales the sum by the softmax scale and rounds it into dq. The order of the additions varies from run to run, so
// the fused backward serves calls that do not ask for determinism; the two-kernel backward is bitwise deterministic.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cutlass/arch/barrier.h>

#include "../../attention_params.h"

namespace jax_flash::cuda_kernels::hopper {

constexpr int kSumTileRows = 64;  // the key-major kernel's streamed tile when it fuses
constexpr int kSumRowPad = 4;

// Whether a call's backward runs fused. A fused form exists for head dims <= 128 (one key pass, 64-query streamed
// tiles), but on the H200 (docs/benchmarks.md, sixth session) fusing paid only in the 128 instantiation with long
// query axes, 1-6% slower at S = 1k and 0-3% slower at head dim 64. As merged (eighth session) it gains 4% forward+
// backward at D = 128, S = 4k full and 3% causal. Elsewhere dQ keeps its own (query-major) kernel: fusing
// everywhere, timed again after the fused loop got cheaper (twenty-second session, H100), still lost 1.6-5.5% at
// head dim 64 and 4% at 128 with 1k causal queries.
constexpr int kFusedHeadDim = 128;  // the one instantiation that fuses (head dims 65..128)
constexpr int64_t kFusedMinQueries = 2048;
inline bool fuses_query_gradient(const AttentionShape& s, bool deterministic) {
  return !deterministic && s.head_dim > kFusedHeadDim - 64 && s.head_dim <= kFusedHeadDim &&
         s.seqlen_q >= kFusedMinQueries;
}

// Hopper instantiations are multiples of 64 and a call runs in the smallest one that holds its head dim; the
// launcher checks that the instantiation's padded row agrees.
inline int64_t sum_row_stride(int64_t head_dim) { return (head_dim + 63) / 64 * 64 + kSumRowPad; }

template <typename Int>  // int in the kernels, int64_t from an AttentionShape
__host__ __device__ inline Int sum_query_tiles(Int seqlen_q) {
  return (seqlen_q + kSumTileRows - 1) / kSumTileRows;
}

// The block of (batch, query head, query tile) among a call's blocks, `tiles` query tiles per head: it starts
// block * kSumTileRows rows into the sum.
__host__ __device__ inline int64_t sum_block(int64_t batch, int64_t head, int64_t tile, int64_t heads_q,
                                             int64_t tiles) {
  return (batch * heads_q + head) * tiles + tile;
}

inline size_t query_gradient_sum_bytes(const AttentionShape& s) {
  return sizeof(float) *
         size_t(s.batch * s.heads_q * sum_query_tiles(s.seqlen_q) * kSumTileRows * sum_row_stride(s.head_dim));
}

// Where the sum starts after `rows_bytes` of per-row inputs, and what the workspace needs for it.
inline size_t query_gradient_sum_offset(size_t rows_bytes) { return (rows_bytes + 255) / 256 * 256; }
inline size_t query_gradient_sum_workspace_bytes(const AttentionShape& s, bool deterministic, size_t rows_bytes) {
  return fuses_query_gradient(s, deterministic)
             ? query_gradient_sum_offset(rows_bytes) - rows_bytes + query_gradient_sum_bytes(s)
             : 0;
}

// dq [batch, seqlen_q, heads_q, head_dim] = scale * sum, two elements per thread and step (head_dim is even).
template <typename Element>
__global__ void round_query_gradient_kernel(const float* sum, Element* dq, AttentionShape s, int64_t row_stride,
                                            float scale) {
  const int64_t pairs_per_row = s.head_dim / 2, tiles = sum_query_tiles(s.seqlen_q);
  const int64_t pairs = s.batch * s.seqlen_q * s.heads_q * pairs_per_row;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < pairs; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t column = 2 * (i % pairs_per_row);
    int64_t rest = i / pairs_per_row;
    const int64_t head = rest % s.heads_q;
    rest /= s.heads_q;
    const int64_t row = rest % s.seqlen_q, batch = rest / s.seqlen_q;
    const int64_t block = sum_block(batch, head, row / kSumTileRows, s.heads_q, tiles);
    const float2 value =
        *reinterpret_cast<const float2*>(sum + (block * kSumTileRows + row % kSumTileRows) * row_stride + column);
    dq[2 * i] = Element(value.x * scale);
    dq[2 * i + 1] = Element(value.y * scale);
  }
}

template <typename Element>
cudaError_t launch_round_query_gradient(const float* sum, void* dq, const AttentionShape& s, float scale,
                                        cudaStream_t stream) {
  const int64_t pairs = s.batch * s.seqlen_q * s.heads_q * (s.head_dim / 2);
  if (pairs == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const int64_t blocks = (pairs + kThreads - 1) / kThreads;
  round_query_gradient_kernel<Element><<<unsigned(blocks < 65536 ? blocks : 65536), kThreads, 0, stream>>>(
      sum, static_cast<Element*>(dq), s, sum_row_stride(s.head_dim), scale);
  return cudaGetLastError();
}

// Adds `bytes` of float32 from shared memory into global memory, element by element, as one asynchronous bulk
// operation of the issuing thread's current bulk group (both addresses 16-byte aligned, bytes a multiple of 16).
__device__ __forceinline__ void bulk_reduce_add(float* global, const float* shared, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" ::"l"(global),
               "r"(static_cast<uint32_t>(__cvta_generic_to_shared(shared))), "r"(bytes)
               : "memory");
}

// The fused backward's dQ writer, one thread: each round waits for the consumers' block in shared memory (its
// "full" barrier, with the block's offset in the sum, or -1 once the consumers are done), adds it to the sum, and
// hands the buffer back once the bulk operation has read it.
template <class Storage>
__device__ void add_query_gradient_tiles(Storage& smem, float* sum) {
  for (uint32_t phase = 0;; phase ^= 1) {
    cutlass::arch::ClusterBarrier::wait(&smem.query_gradient_full, phase);
    const int64_t target = smem.query_gradient_target;
    if (target < 0) break;
    bulk_reduce_add(sum + target, &smem.query_gradient[0][0], sizeof(smem.query_gradient));
    // CuTe's bulk-group commit and read-wait: named for TMA stores, the same for any bulk operation.
    cute::tma_store_arrive();
    cute::tma_store_wait<0>();
    cutlass::arch::ClusterBarrier::arrive(&smem.query_gradient_empty);
  }
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");  // the last additions are complete, not just read
}

}  // namespace jax_flash::cuda_kernels::hopper
