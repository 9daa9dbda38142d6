// Walks a consumer warpgroup's float32 accumulator row by row, one adjacent column pair at a time
// (for_each_column_pair), and writes it that way to a [.., rows, .., head_dim] global tensor as 16-bit elements,
// skipping rows and columns past the tensor's extent (store_accumulator).
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/array.h>

#include "warpgroup_gemm.cuh"

namespace jax_flash::cuda_kernels::hopper {

template <bool kBounded, class Accumulator, class Coordinates, class BeginRow>
__device__ __forceinline__ void visit_column_pairs(Accumulator const& accumulator, Coordinates const& coordinates,
                                                   int rows, int columns, BeginRow begin_row) {
  Tensor values = make_tensor(accumulator.data(), accumulator_rows(accumulator.layout()));
  Tensor places = make_tensor(coordinates.data(), accumulator_rows(coordinates.layout()));
  CUTE_UNROLL
  for (int r = 0; r < size<0>(values); ++r) {
    const int row = get<0>(places(r, 0));
    if (kBounded && row >= rows) continue;
    auto pair = begin_row(r, row);
    // The accumulator's innermost mode is a pair of adjacent columns.
    CUTE_UNROLL
    for (int c = 0; c < size<1>(values); c += 2) {
      const int column = get<1>(places(r, c));
      if (!kBounded || column < columns) pair(column, values(r, c), values(r, c + 1));
    }
  }
}

// For each of the thread's rows inside [0, rows), calls begin_row(r, row), which returns the row's pair visitor,
// then calls that visitor (column, first, second) for each adjacent column pair inside [0, columns); r is the
// thread's row index, row and column the tile's. `coordinates` is the thread's partition of the tile's identity
// tensor. Whatever a row's visitor captures (a global row pointer, a scale) is computed once per row, not per pair.
template <class Accumulator, class Coordinates, class BeginRow>
__device__ __forceinline__ void for_each_column_pair(Accumulator const& accumulator, Coordinates const& coordinates,
                                                     int rows, int columns, BeginRow begin_row) {
  visit_column_pairs<true>(accumulator, coordinates, rows, columns, begin_row);
}

// The same for a tile that lies wholly inside its destination: every pair, without the bounds tests (ptxas cannot
// drop them itself, the coordinates coming from the thread index).
template <class Accumulator, class Coordinates, class BeginRow>
__device__ __forceinline__ void for_each_column_pair_of_tile(Accumulator const& accumulator,
                                                             Coordinates const& coordinates, BeginRow begin_row) {
  visit_column_pairs<false>(accumulator, coordinates, 0, 0, begin_row);
}

// `row_pointer(row)` gives the first element of global row `row` (relative to the tile); `row_factor(r)` scales
// the thread's r-th row.
template <typename Element, class Accumulator, class Coordinates, class RowPointer, class RowFactor>
__device__ __forceinline__ void store_accumulator(Accumulator const& accumulator, Coordinates const& coordinates,
                                                  int rows, int columns, RowPointer row_pointer,
                                                  RowFactor row_factor) {
  for_each_column_pair(accumulator, coordinates, rows, columns, [&](int r, int row) {
    Element* destination = row_pointer(row);
    const float factor = row_factor(r);
    return [=](int column, float a, float b) {
      cutlass::Array<Element, 2> pair;
      pair[0] = Element(a * factor);
      pair[1] = Element(b * factor);
      *reinterpret_cast<cutlass::Array<Element, 2>*>(destination + column) = pair;
    };
  });
}

}  // namespace jax_flash::cuda_kernels::hopper
