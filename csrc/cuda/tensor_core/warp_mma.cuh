// Warp-level matrix products on m16n8k16 tensor-core fragments: each warp multiplies its own rows by a tile that
// the whole block shares in shared memory.
//
// An accumulator float acc[kMTiles][kNTiles][4] covers 16*kMTiles rows and 8*kNTiles columns. Lane l holds, in
// acc[m][n], the columns 8n + 2(l%4) and +1 of row 16m + l/4 (entries 0, 1) and of row 16m + l/4 + 8 (entries 2, 3).
#pragma once

#include <cstdint>

#include "ptx.cuh"

namespace jax_flash::cuda_kernels::tensor_core {

__device__ __forceinline__ int lane_index() { return static_cast<int>(threadIdx.x) % 32; }

// acc += A B^T. A is 16*kMTiles rows of tile `a` from a_row, B is 8*kNTiles rows of tile `b` from b_row; both keep
// the reduction axis (16*kKSteps long) along their rows, like q and k in q k^T.
template <typename Element, int kMTiles, int kNTiles, int kKSteps, typename TileA, typename TileB>
__device__ __forceinline__ void mma_rows_by_rows(float (&acc)[kMTiles][kNTiles][4], const TileA& a, int a_row,
                                                 const TileB& b, int b_row) {
  static_assert(kNTiles % 2 == 0, "B fragments are loaded 16 rows at a time");
  const int lane = lane_index();
#pragma unroll
  for (int k = 0; k < kKSteps; ++k) {
    uint32_t a_fragment[kMTiles][4];
#pragma unroll
    for (int m = 0; m < kMTiles; ++m)
      ldmatrix_x4(a_fragment[m], a.address(a_row + 16 * m + lane % 16, 16 * k + lane / 16 * 8));
#pragma unroll
    for (int n = 0; n < kNTiles; n += 2) {
      uint32_t b_fragment[4];
      ldmatrix_x4(b_fragment, b.address(b_row + 8 * n + lane / 16 * 8 + lane % 8, 16 * k + lane / 8 % 2 * 8));
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) {
        mma_16816<Element>(acc[m][n], a_fragment[m], b_fragment[0], b_fragment[1]);
        mma_16816<Element>(acc[m][n + 1], a_fragment[m], b_fragment[2], b_fragment[3]);
      }
    }
  }
}

// acc += A B. A is already in registers as operand fragments (see accumulator_to_operand); B is 16*kKSteps rows of
// tile `b` from b_row, with the reduction axis down its rows, like v in p v.
template <typename Element, int kMTiles, int kNTiles, int kKSteps, typename TileB>
__device__ __forceinline__ void mma_registers_by_columns(float (&acc)[kMTiles][kNTiles][4],
                                                         const uint32_t (&a)[kMTiles][kKSteps][4], const TileB& b,
                                                         int b_row) {
  static_assert(kNTiles % 2 == 0, "B fragments are loaded 16 columns at a time");
  const int lane = lane_index();
#pragma unroll
  for (int k = 0; k < kKSteps; ++k) {
#pragma unroll
    for (int n = 0; n < kNTiles; n += 2) {
      uint32_t b_fragment[4];
      ldmatrix_x4_trans(b_fragment, b.address(b_row + 16 * k + lane / 8 % 2 * 8 + lane % 8, 8 * n + lane / 16 * 8));
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) {
        mma_16816<Element>(acc[m][n], a[m][k], b_fragment[0], b_fragment[1]);
        mma_16816<Element>(acc[m][n + 1], a[m][k], b_fragment[2], b_fragment[3]);
      }
    }
  }
}

// Rounds an accumulator into A-operand fragments: the columns of accumulator tiles 2k and 2k+1 become reduction
// step k. This is how p = softmax(q k^T) feeds p v without a trip through shared memory.
template <typename Element, int kMTiles, int kNTiles>
__device__ __forceinline__ void accumulator_to_operand(const float (&acc)[kMTiles][kNTiles][4],
                                                       uint32_t (&a)[kMTiles][kNTiles / 2][4]) {
#pragma unroll
  for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
    for (int k = 0; k < kNTiles / 2; ++k) {
      a[m][k][0] = pack_pair<Element>(acc[m][2 * k][0], acc[m][2 * k][1]);
      a[m][k][1] = pack_pair<Element>(acc[m][2 * k][2], acc[m][2 * k][3]);
      a[m][k][2] = pack_pair<Element>(acc[m][2 * k + 1][0], acc[m][2 * k + 1][1]);
      a[m][k][3] = pack_pair<Element>(acc[m][2 * k + 1][2], acc[m][2 * k + 1][3]);
    }
  }
}

// Row and column, within the warp's 16*kMTiles x 8*kNTiles block, of accumulator entry acc[m][n][e].
struct AccumulatorIndex {
  int row;
  int column;
};

__device__ __forceinline__ AccumulatorIndex accumulator_index(int m, int n, int e) {
  const int lane = lane_index();
  return {16 * m + lane / 4 + e / 2 * 8, 8 * n + lane % 4 * 2 + e % 2};
}

// Reductions over the four lanes that share a row of an accumulator.
__device__ __forceinline__ float row_max_of_quad(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float row_sum_of_quad(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

}  // namespace jax_flash::cuda_kernels::tensor_core
