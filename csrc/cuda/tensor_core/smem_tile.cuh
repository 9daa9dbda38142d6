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
  // The tile's shared-memory address, so fragment addresses are 32-bit sums that fold into ldmatrix's immediate
  // offset instead of a generic-to-shared conversion per load.
  uint32_t base;

  __device__ __forceinline__ explicit SmemTile(Element* tile_data) : data(tile_data), base(shared_address(tile_data)) {}

  __device__ __forceinline__ uint32_t address(int r, int column) const {
    return base + static_cast<uint32_t>((r * kPitch + column) * static_cast<int>(sizeof(Element)));
  }

  // Starts copying rows [0, rows_valid) x columns [0, head_dim) of a global tensor whose row r starts at
  // src + r * row_stride; rows and columns outside are zero-filled, so MMAs over the padding add nothing.
  // `src` must be a legal address even when rows_valid <= 0 (nothing is read then).
  //
  // Each thread keeps one 16-byte column and walks rows kThreads / kChunksPerRow apart, so its global pointer and
  // shared address advance by constants: the copy costs a few instructions per 16 bytes, not an index division.
  template <int kThreads>
  __device__ __forceinline__ void load_async(const Element* src, int64_t row_stride, int64_t rows_valid,
                                             int head_dim) const {
    constexpr int kRowsPerPass = kThreads / kChunksPerRow;
    static_assert(kRowsPerPass > 0, "a block must cover at least one row per pass");
    constexpr int kPasses = (kRows + kRowsPerPass - 1) / kRowsPerPass;
    const int thread = static_cast<int>(threadIdx.x);
    // With 12 or 24 chunks per row, the last few threads of a block would start a partial row: they sit out.
    if (thread >= kRowsPerPass * kChunksPerRow) return;
    const int first_row = thread / kChunksPerRow;
    const int column = thread % kChunksPerRow * kChunkElements;
    const bool column_valid = column < head_dim;
    // Rows past kRows are never copied, so the count fits 32-bit compares.
    const int rows = rows_valid < kRows ? static_cast<int>(rows_valid) : kRows;
    const Element* row_src = src + first_row * row_stride + column;
    const uint32_t dst = address(first_row, column);
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int r = first_row + pass * kRowsPerPass;
      if (kRows % kRowsPerPass == 0 || r < kRows) {
        const bool valid = column_valid && r < rows;
        cp_async_16(dst + pass * kRowsPerPass * kPitch * static_cast<int>(sizeof(Element)), valid ? row_src : src,
                    valid);
      }
      row_src += kRowsPerPass * row_stride;
    }
  }
};

}  // namespace jax_flash::cuda_kernels::tensor_core
