// The element mask of a partial tile under a token mask, on the (rows, columns) view of a thread's wgmma accumulator
// (warpgroup_gemm.cuh): one bit per entry, computed in a rolled loop over the thread's columns (a token's id and
// position are loaded once per column and once per row), then applied to the accumulator in an unrolled one. Only
// partial tiles run it, so dense tiles keep their short straight-line loop bodies.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>

#include "../../attention_mask.h"
#include "../tensor_core/token_tiles.cuh"
#include "tile_tickets.cuh"

namespace jax_flash::cuda_kernels::hopper {

using tensor_core::pair_visible;
using tensor_core::token_at;
using tensor_core::TokenAt;
using tensor_core::TokenRow;

// The masking a tile the token walk just returned needs: none when full; the window's rule alone when its tokens are
// uniform and the window applies to token indices (no positions), as on the causal diagonal inside a document;
// otherwise the per-token test below.
template <class Walk>
__device__ __forceinline__ TileMasking token_tile_masking(const Walk& walk, int tile, bool has_positions) {
  if (walk.full(tile)) return TileMasking::kNone;
  return walk.uniform(tile) && !has_positions ? TileMasking::kWindow : TileMasking::kTokens;
}

// Bit r * columns + c is set when entry (r, c) is visible. `coords` holds each entry's (row, column) in the tile;
// rows are tokens of `rows` from row_begin, and column_token(column) gives the tile's column-th token (TokenAt).
// Rows are keys in the key-major backward (kRowsAreKeys).
template <bool kRowsAreKeys, class Coords, class ColumnToken>
__device__ __forceinline__ uint64_t visible_token_entries(const Coords& coords, const TokenRow& rows, int row_begin,
                                                          ColumnToken column_token, const AttentionMask& mask) {
  constexpr int kRows = decltype(cute::size<0>(coords))::value;
  constexpr int kColumns = decltype(cute::size<1>(coords))::value;
  static_assert(kRows * kColumns <= 64, "one 64-bit word of entries");
  TokenAt row_tokens[kRows];
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) row_tokens[r] = token_at(rows, row_begin + cute::get<0>(coords(r, 0)));
  uint64_t bits = 0;
#pragma unroll 1
  for (int c = 0; c < kColumns; ++c) {
    const TokenAt column = column_token(cute::get<1>(coords(0, c)));
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const bool visible =
          kRowsAreKeys ? pair_visible(column, row_tokens[r], mask) : pair_visible(row_tokens[r], column, mask);
      bits |= uint64_t(visible) << (r * kColumns + c);
    }
  }
  return bits;
}

// The same with the columns read from global memory: tokens of `columns` from column_begin.
template <bool kRowsAreKeys, class Coords>
__device__ __forceinline__ uint64_t visible_token_entries(const Coords& coords, const TokenRow& rows, int row_begin,
                                                          const TokenRow& columns, int column_begin,
                                                          const AttentionMask& mask) {
  return visible_token_entries<kRowsAreKeys>(
      coords, rows, row_begin, [&](int column) { return token_at(columns, column_begin + column); }, mask);
}

// Sets every entry of `view` whose bit is clear to `hidden`.
template <class View>
__device__ __forceinline__ void hide_entries(View& view, uint64_t bits, float hidden) {
  constexpr int kColumns = decltype(cute::size<1>(view))::value;
  CUTE_UNROLL
  for (int r = 0; r < cute::size<0>(view); ++r) {
    CUTE_UNROLL
    for (int c = 0; c < kColumns; ++c) {
      if (!((bits >> (r * kColumns + c)) & 1u)) view(r, c) = hidden;
    }
  }
}

}  // namespace jax_flash::cuda_kernels::hopper
