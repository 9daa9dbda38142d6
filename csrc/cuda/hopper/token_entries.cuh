// The element mask of a partial tile under a token mask, on the (rows, columns) view of a thread's wgmma accumulator
// (warpgroup_gemm.cuh). The backward computes one bit per entry in a rolled loop over the thread's columns (a token's
// id and position are loaded once per column and once per row), then applies them in an unrolled one; the forward
// masks in one straight-line pass over key tokens staged in shared memory. Only partial tiles run either, so dense
// tiles keep their short loop bodies.
#pragma once

#include <climits>
#include <cstdint>

#include <cute/tensor.hpp>

#include "../../attention_mask.h"
#include "../tensor_core/token_tiles.cuh"
#include "tile_tickets.cuh"

namespace jax_flash::cuda_kernels::hopper {

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

// pair_visible's rule for one row, in int32: the row's segment and the other side's positions it admits,
// [lowest, highest] (empty when the row is past its length). A query row admits key positions in
// [p - left, p + right]; a key row (kRowIsKey) admits query positions in [p - right, p + left]. Positions are int32,
// so clamping the window's int64 bounds to int32 keeps the rule exact.
struct RowRule {
  int segment;
  int lowest, highest;
};

template <bool kRowIsKey = false>
__device__ __forceinline__ RowRule row_rule(const TokenAt& row, const AttentionMask& mask) {
  if (!row.live) return {0, INT_MAX, INT_MIN};
  const int64_t below = kRowIsKey ? mask.window_right : mask.window_left;
  const int64_t above = kRowIsKey ? mask.window_left : mask.window_right;
  const int64_t lowest = below >= 0 ? int64_t{row.position} - below : INT_MIN;
  const int64_t highest = above >= 0 ? int64_t{row.position} + above : INT_MAX;
  return {row.segment, static_cast<int>(lowest < INT_MIN ? INT_MIN : lowest),
          static_cast<int>(highest > INT_MAX ? INT_MAX : highest)};
}

__device__ __forceinline__ bool rule_admits(const RowRule& rule, const TokenAt& other) {
  return other.live && other.segment == rule.segment && other.position >= rule.lowest &&
         other.position <= rule.highest;
}

// Bit r * columns + c is set when entry (r, c) is visible. `coords` holds each entry's (row, column) in the tile;
// rows are tokens of `rows` from row_begin, and column_token(column) gives the tile's column-th token (TokenAt).
// Rows are keys in the key-major backward (kRowsAreKeys). Each row's rule is computed once; the columns' tokens are
// read kColumnsAtOnce at a time, their loads in flight together (one round trip per group, not per column), in a
// rolled loop over the groups that keeps the registers to one group's tokens.
template <bool kRowsAreKeys, class Coords, class ColumnToken>
__device__ __forceinline__ uint64_t visible_token_entries(const Coords& coords, const TokenRow& rows, int row_begin,
                                                          ColumnToken column_token, const AttentionMask& mask) {
  constexpr int kRows = decltype(cute::size<0>(coords))::value;
  constexpr int kColumns = decltype(cute::size<1>(coords))::value;
  constexpr int kColumnsAtOnce = 4;
  static_assert(kRows * kColumns <= 64, "one 64-bit word of entries");
  static_assert(kColumns % kColumnsAtOnce == 0, "whole groups of columns");
  RowRule rules[kRows];
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r)
    rules[r] = row_rule<kRowsAreKeys>(token_at(rows, row_begin + cute::get<0>(coords(r, 0))), mask);
  uint64_t bits = 0;
#pragma unroll 1
  for (int first = 0; first < kColumns; first += kColumnsAtOnce) {
    TokenAt columns[kColumnsAtOnce];
    CUTE_UNROLL
    for (int i = 0; i < kColumnsAtOnce; ++i) columns[i] = column_token(cute::get<1>(coords(0, first + i)));
    CUTE_UNROLL
    for (int i = 0; i < kColumnsAtOnce; ++i) {
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r)
        bits |= uint64_t(rule_admits(rules[r], columns[i])) << (r * kColumns + first + i);
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

// Sets the entries of `view` whose (query, key) pair is not visible to `hidden`, in straight-line code: each row's
// rule once, then every column's key token (key_token(column), a shared-memory read) tested against both rows. The
// rolled loop of visible_token_entries waits for each column's load in turn; here the loads of a tile go out
// together. `coords` and `rows` as in visible_token_entries.
template <class View, class Coords, class KeyToken>
__device__ __forceinline__ void hide_unseen_keys(View& view, const Coords& coords, const TokenRow& rows,
                                                 int row_begin, KeyToken key_token, const AttentionMask& mask,
                                                 float hidden) {
  constexpr int kRows = decltype(cute::size<0>(view))::value;
  constexpr int kColumns = decltype(cute::size<1>(view))::value;
  RowRule rules[kRows];
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) rules[r] = row_rule(token_at(rows, row_begin + cute::get<0>(coords(r, 0))), mask);
  CUTE_UNROLL
  for (int c = 0; c < kColumns; ++c) {
    const TokenAt key = key_token(cute::get<1>(coords(0, c)));
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      if (!rule_admits(rules[r], key)) view(r, c) = hidden;
    }
  }
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
