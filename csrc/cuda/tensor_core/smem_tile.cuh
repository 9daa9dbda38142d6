// Tiles of rows of q, k, v or dout staged in shared memory, and their asynchronous loads.
//
// A tile holds kRows rows of kHeadDim elements (the head-dim bucket; a call's head_dim may be smaller). Each row is
// padded by 16 bytes: every bucket has an even number of 16-byte chunks per row, so the padded pitch is an odd
// number of chunks and the eight rows one ldmatrix reads start in eight different bank groups.
#pragma once

#include <cstdint>

#include "ptx.cuh"

namespace jax_flash::cuda_kernels::tensor_core {

constexpr int kChunkElements = 8;  // 16 bytes of a 2-byte element type

template <typename Element, int kRows, int kHeadDim>
struct SmemTile {
  static_assert(kHeadDim % 16 == 0, "head-dim buckets are multiples of 16 (one MMA k-step)");
  static_assert((kHeadDim / kChunkElements) % 2 == 0, "the padded pitch must be an odd number of chunks");
  static constexpr int kPitch = kHeadDim + kChunkElements;
  static constexpr int kElements = kRows * kPitch;
  static constexpr int kBytes = kElements * static_cast<int>(sizeof(Element));
  static constexpr int kChunksPerRow = kHeadDim / kChunkElements;

  Element* data;

  __device__ __forceinline__ Element* row(int r) const { return data + r * kPitch; }
  __device__ __forceinline__ uint32_t address(int r, int column) const { return shared_address(data + r * kPitch + column); }

  // Starts copying rows [0, rows_valid) x columns [0, head_dim) of a global tensor whose row r starts at
  // src + r * row_stride; rows and columns outside are zero-filled, so MMAs over the padding add nothing.
  // `src` must be a legal address even when rows_valid <= 0 (nothing is read then).
  template <int kThreads>
  __device__ __forceinline__ void load_async(const Element* src, int64_t row_stride, int64_t rows_valid,
                                             int head_dim) const {
    constexpr int kChunks = kRows * kChunksPerRow;
#pragma unroll
    for (int chunk = static_cast<int>(threadIdx.x); chunk < kChunks; chunk += kThreads) {
      const int r = chunk / kChunksPerRow;
      const int column = (chunk % kChunksPerRow) * kChunkElements;
      const bool valid = r < rows_valid && column < head_dim;
      cp_async_16(address(r, column), valid ? src + r * row_stride + column : src, valid);
    }
  }
};

}  // namespace jax_flash::cuda_kernels::tensor_core
