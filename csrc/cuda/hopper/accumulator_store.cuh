// Writes a consumer warpgroup's float32 accumulator rows to a [.., rows, .., head_dim] global tensor as 16-bit
// elements, one 32-bit store per adjacent column pair, skipping rows and columns past the tensor's extent.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/array.h>

#include "warpgroup_gemm.cuh"

namespace jax_flash::cuda_kernels::hopper {

// `accumulator` and `coordinates` are a thread's fragment and its partition of the tile's identity tensor;
// `row_pointer(row)` gives the first element of global row `row` (relative to the tile); `row_factor(r)` scales
// the thread's r-th row.
template <typename Element, class Accumulator, class Coordinates, class RowPointer, class RowFactor>
__device__ __forceinline__ void store_accumulator(Accumulator const& accumulator, Coordinates const& coordinates,
                                                  int rows, int columns, RowPointer row_pointer,
                                                  RowFactor row_factor) {
  Tensor values = make_tensor(accumulator.data(), accumulator_rows(accumulator.layout()));
  Tensor places = make_tensor(coordinates.data(), accumulator_rows(coordinates.layout()));
  CUTE_UNROLL
  for (int r = 0; r < size<0>(values); ++r) {
    const int row = get<0>(places(r, 0));
    if (row >= rows) continue;
    Element* destination = row_pointer(row);
    const float factor = row_factor(r);
    // The accumulator's innermost mode is a pair of adjacent columns.
    CUTE_UNROLL
    for (int c = 0; c < size<1>(values); c += 2) {
      const int column = get<1>(places(r, c));
      if (column >= columns) continue;
      cutlass::Array<Element, 2> pair;
      pair[0] = Element(values(r, c) * factor);
      pair[1] = Element(values(r, c + 1) * factor);
      *reinterpret_cast<cutlass::Array<Element, 2>*>(destination + column) = pair;
    }
  }
}

}  // namespace jax_flash::cuda_kernels::hopper
