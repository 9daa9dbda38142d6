// Tile skipping for the per-token inputs (TokenMask: lengths, segment ids, positions) in the tensor-core kernels.
//
// A kernel block owns one tile of tokens (query rows, or keys for dk/dv) and walks the tiles of the other side. Under
// a TokenMask each tile is summarized by the range of its live tokens (below the sequence and the length) and the
// ranges of their segment ids and positions; from two summaries a (query tile, key tile) pair is empty (skipped: not
// loaded, no MMA), full (every pair visible: no element mask) or partial (masked element by element by
// token_visible's rule). The walked side is classified 32 tiles at a time, a tile per lane, and a ballot hands the
// warp every lane's answer, so the search for the next non-empty tile costs one pass over the ids per 32 tiles.
#pragma once

#include <climits>
#include <cstdint>
#include <type_traits>

#include "../../attention_mask.h"
#include "../../attention_params.h"
#include "warp_mma.cuh"

namespace jax_flash::cuda_kernels::tensor_core {

// One side's per-token inputs for one batch row: pointers at the row's first token (null when absent) and the count
// of live tokens, min(seq, length) and at least 0.
struct TokenRow {
  const int32_t* segment_ids;
  const int32_t* positions;
  int live;
};

__device__ __forceinline__ TokenRow token_row(const int32_t* lengths, const int32_t* segment_ids,
                                              const int32_t* positions, int64_t seq, int64_t batch) {
  int64_t live = lengths && lengths[batch] < seq ? lengths[batch] : seq;
  return {segment_ids ? segment_ids + batch * seq : nullptr, positions ? positions + batch * seq : nullptr,
          live > 0 ? static_cast<int>(live) : 0};
}

__device__ __forceinline__ TokenRow query_row(const TokenMask& t, const AttentionShape& shape, int64_t batch) {
  return token_row(t.q_lengths, t.q_segment_ids, t.q_positions, shape.seqlen_q, batch);
}

__device__ __forceinline__ TokenRow key_row(const TokenMask& t, const AttentionShape& shape, int64_t batch) {
  return token_row(t.kv_lengths, t.kv_segment_ids, t.kv_positions, shape.seqlen_k, batch);
}

// The summary of tokens [begin, end) of a row. Absent segment ids read as all 0 (every pair shares a segment);
// absent positions are the token indices.
struct TokenSpan {
  int begin;
  int live_end;  // tokens [begin, live_end) are live; none when live_end <= begin
  bool whole;    // every token of [begin, end) is live
  int segment_min, segment_max;
  int position_min, position_max;
};

// The span of the tokens begin + first, begin + first + stride, ... below end: a lane's share when the lanes of a
// warp split a tile (merge with merge_across_warp), or a whole tile when first = 0 and stride = 1.
__device__ __forceinline__ TokenSpan partial_span(const TokenRow& row, int begin, int end, int first, int stride) {
  TokenSpan span;
  span.begin = begin;
  span.live_end = end < row.live ? end : row.live;
  span.whole = span.live_end == end;
  span.segment_min = row.segment_ids ? INT_MAX : 0;
  span.segment_max = row.segment_ids ? INT_MIN : 0;
  span.position_min = INT_MAX;
  span.position_max = INT_MIN;
  if (!row.positions) {
    span.position_min = begin;
    span.position_max = span.live_end - 1;
  }
  if (!row.segment_ids && !row.positions) return span;
#pragma unroll 1
  for (int token = begin + first; token < span.live_end; token += stride) {
    if (row.segment_ids) {
      const int id = row.segment_ids[token];
      span.segment_min = min(span.segment_min, id);
      span.segment_max = max(span.segment_max, id);
    }
    if (row.positions) {
      const int position = row.positions[token];
      span.position_min = min(span.position_min, position);
      span.position_max = max(span.position_max, position);
    }
  }
  return span;
}

__device__ __forceinline__ TokenSpan merge_across_warp(TokenSpan span) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    span.segment_min = min(span.segment_min, __shfl_xor_sync(0xffffffffu, span.segment_min, offset));
    span.segment_max = max(span.segment_max, __shfl_xor_sync(0xffffffffu, span.segment_max, offset));
    span.position_min = min(span.position_min, __shfl_xor_sync(0xffffffffu, span.position_min, offset));
    span.position_max = max(span.position_max, __shfl_xor_sync(0xffffffffu, span.position_max, offset));
  }
  return span;
}

// A block's own tile, summarized by the whole warp (every lane gets the same answer).
__device__ __forceinline__ TokenSpan warp_span(const TokenRow& row, int begin, int end) {
  return merge_across_warp(partial_span(row, begin, end, static_cast<int>(threadIdx.x % 32), 32));
}

enum class TileKind { kEmpty, kPartial, kFull };

// The same rule as token_visible, applied to ranges: conservative, kPartial is always a correct answer.
__device__ __forceinline__ TileKind classify(const TokenSpan& q, const TokenSpan& k, const AttentionMask& mask) {
  if (q.live_end <= q.begin || k.live_end <= k.begin) return TileKind::kEmpty;
  if (q.segment_max < k.segment_min || k.segment_max < q.segment_min) return TileKind::kEmpty;
  const int64_t left = mask.window_left, right = mask.window_right;
  if ((left >= 0 && k.position_max < int64_t{q.position_min} - left) ||
      (right >= 0 && k.position_min > int64_t{q.position_max} + right))
    return TileKind::kEmpty;
  const bool one_segment =
      q.segment_min == q.segment_max && k.segment_min == k.segment_max && q.segment_min == k.segment_min;
  const bool inside_window = (left < 0 || k.position_min >= int64_t{q.position_max} - left) &&
                             (right < 0 || k.position_max <= int64_t{q.position_min} + right);
  return q.whole && k.whole && one_segment && inside_window ? TileKind::kFull : TileKind::kPartial;
}

// The two sides of a block's walk: its own tile (query rows, or keys for dk/dv) and the row of the side it walks in
// tiles of `walked_tile` tokens. Kernels build it only when the walk needs new tiles classified, so none of it stays
// in registers across their main loops.
struct WalkSides {
  TokenRow own;
  int own_begin, own_end;
  TokenRow walked;
  int walked_tile;
  bool walked_are_keys;
};

// The walked side's non-empty tiles in increasing order, classified 32 at a time (a search may restart lower, e.g.
// for the next head of a GQA group).
class TileWalk {
 public:
  // The first non-empty tile in [tile, end), or end if none.
  __device__ __forceinline__ int64_t first_visible(int64_t tile, int64_t end, const WalkSides& sides,
                                                   const AttentionMask& mask) {
    // Tile indices fit 32 bits (sequences are shorter than 2^31 tokens); the state then takes three registers.
    while (tile < end) {
      if (tile < base_ || tile >= base_ + kWindow) classify_window(static_cast<int>(tile), end, sides, mask);
      const unsigned ahead = visible_ >> (tile - base_);
      if (ahead) return tile + __ffs(ahead) - 1;
      tile = base_ + kWindow;
    }
    return end;
  }

  // Whether a tile just returned by first_visible needs no element mask.
  __device__ __forceinline__ bool full(int64_t tile) const { return (full_ >> (tile - base_)) & 1u; }

 private:
  __device__ __forceinline__ void classify_window(int base, int64_t end, const WalkSides& sides,
                                                  const AttentionMask& mask) {
    base_ = base;
    const TokenSpan own = warp_span(sides.own, sides.own_begin, sides.own_end);
    const int64_t tile = base + threadIdx.x % 32;
    TileKind kind = TileKind::kEmpty;
    if (tile < end) {
      const int begin = static_cast<int>(tile * sides.walked_tile);
      const TokenSpan walked = partial_span(sides.walked, begin, begin + sides.walked_tile, 0, 1);
      kind = sides.walked_are_keys ? classify(own, walked, mask) : classify(walked, own, mask);
    }
    visible_ = __ballot_sync(0xffffffffu, kind != TileKind::kEmpty);
    full_ = __ballot_sync(0xffffffffu, kind == TileKind::kFull);
  }

  static constexpr int kWindow = 32;  // a tile per lane

  int base_ = -kWindow;  // the window [base_, base_ + kWindow) holds no tile before the first search
  unsigned visible_ = 0;
  unsigned full_ = 0;
};

// One token's inputs as token_visible reads them. A token past the row's live count (the length, or the sequence
// for a tile's padding) sees nothing and reads no memory.
struct TokenAt {
  bool live;
  int segment;
  int position;
};

__device__ __forceinline__ TokenAt token_at(const TokenRow& row, int64_t index) {
  const bool live = index < row.live;
  return {live, live && row.segment_ids ? row.segment_ids[index] : 0,
          live && row.positions ? row.positions[index] : static_cast<int>(index)};
}

// token_visible, on tokens a thread loaded once for all the pairs of a tile they take part in.
__device__ __forceinline__ bool pair_visible(const TokenAt& query, const TokenAt& key, const AttentionMask& mask) {
  return query.live && key.live && query.segment == key.segment && key_visible(mask, query.position, key.position);
}

// A word of one bit per entry of a float[kM][kN][4] accumulator: 32 bits where they suffice, to spare a register.
template <int kM, int kN>
using EntryBits = std::conditional_t<kM * kN * 4 <= 32, uint32_t, uint64_t>;

// One bit per entry of a warp's float[kM][kN][4] accumulator, bit (m * kN + n) * 4 + e: whether its (query, key)
// pair is visible. Rows of the accumulator are tokens of `rows` from row0 and columns tokens of `columns` from
// column0 (accumulator_index); for dk/dv the rows are keys (kRowsAreKeys). Kernels compute it for a partial tile
// before the tile's first MMA, while few registers are live; columns go one n-tile at a time for the same reason.
template <int kM, int kN, bool kRowsAreKeys>
__device__ __forceinline__ EntryBits<kM, kN> visible_entries(const TokenRow& rows, int64_t row0,
                                                             const TokenRow& columns, int64_t column0,
                                                             const AttentionMask& mask) {
  static_assert(kM * kN * 4 <= 64, "one 64-bit word of entries");
  const int lane = lane_index();
  TokenAt row_tokens[kM][2];
#pragma unroll
  for (int m = 0; m < kM; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) row_tokens[m][h] = token_at(rows, row0 + 16 * m + lane / 4 + 8 * h);
  EntryBits<kM, kN> bits = 0;
#pragma unroll 1
  for (int n = 0; n < kN; ++n) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const TokenAt column = token_at(columns, column0 + 8 * n + lane % 4 * 2 + c);
#pragma unroll
      for (int m = 0; m < kM; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const bool visible = kRowsAreKeys ? pair_visible(column, row_tokens[m][h], mask)
                                            : pair_visible(row_tokens[m][h], column, mask);
          bits |= static_cast<EntryBits<kM, kN>>(visible) << ((m * kN + n) * 4 + 2 * h + c);
        }
    }
  }
  return bits;
}

// Entry [m][n][e] of bits from visible_entries.
template <int kN, typename Bits>
__device__ __forceinline__ bool entry_visible(Bits bits, int m, int n, int e) {
  return (bits >> ((m * kN + n) * 4 + e)) & 1u;
}

}  // namespace jax_flash::cuda_kernels::tensor_core
