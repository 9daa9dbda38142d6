// How the simple kernels map blocks to rows, and the one place they are launched.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "warp_rows.cuh"

namespace jax_flash::cuda_kernels {

// Each warp owns one row (a query row or a key row), so a block covers kWarpsPerBlock consecutive rows of one
// (batch, head) and shares every staged tile among them.
constexpr int kWarpsPerBlock = 8;
// Kernels are declared __launch_bounds__(kThreadsPerBlock, 1). With the block size alone, ptxas (CUDA 13, sm_90a)
// capped registers to raise occupancy and spilled; the explicit minimum of one block per SM lets it keep every value
// in registers, which still leaves room for several blocks per SM.
constexpr int kThreadsPerBlock = kWarpsPerBlock * kWarpSize;
constexpr int64_t kMaxGridBlocks = 2147483647;  // gridDim.x limit

__device__ __forceinline__ int warp_id() { return static_cast<int>(threadIdx.x) / kWarpSize; }

__host__ __device__ constexpr int64_t blocks_covering(int64_t rows) {
  return (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
}

// The rows [row_begin, row_end) of one (batch, head) that this block covers. Blocks are numbered over
// [batch][heads][row blocks] in blockIdx.x alone, which, unlike gridDim.y and .z, has room for any batch * heads.
struct BlockRows {
  int64_t batch;
  int64_t head;
  int64_t row_begin;
  int64_t row_end;
};

__device__ __forceinline__ BlockRows block_rows(int64_t heads, int64_t rows) {
  const int64_t row_blocks = blocks_covering(rows);
  const int64_t block = blockIdx.x;
  const int64_t row_begin = (block % row_blocks) * kWarpsPerBlock;
  const int64_t row_end = row_begin + kWarpsPerBlock < rows ? row_begin + kWarpsPerBlock : rows;
  return {block / (row_blocks * heads), (block / row_blocks) % heads, row_begin, row_end};
}

// Launches `kernel` on `blocks` blocks of kThreadsPerBlock threads, or does nothing when there is no work; returns
// the launch error.
template <typename... KernelParams, typename... Args>
cudaError_t launch_blocks(void (*kernel)(KernelParams...), int64_t blocks, cudaStream_t stream, const Args&... args) {
  if (blocks == 0) return cudaSuccess;
  if (blocks > kMaxGridBlocks) return cudaErrorInvalidValue;
  kernel<<<static_cast<unsigned>(blocks), kThreadsPerBlock, 0, stream>>>(args...);
  return cudaGetLastError();
}

}  // namespace jax_flash::cuda_kernels
