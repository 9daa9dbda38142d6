// Tile skipping for the per-token inputs (TokenMask: lengths, segment ids, positions) in the tensor-core kernels.
//
// A kernel block owns one tile of tokens (query rows, or keys for dk/dv) and walks the tiles of the other side. Under
// a TokenMask each tile is summarized by the range of its live tokens (below the sequence and the length) and the
// ranges of their segment ids and positions, read from the per-call chunk summaries (token_chunks.h); from two
// summaries a (query tile, key tile) pair is empty (skipped: not
// loaded, no MMA), full (every pair visible: no element mask) or partial (masked element by element by
// token_visible's rule). The walked side is classified 32 tiles at a time, a tile per lane, and a ballot hands the
// warp every lane's answer, so the search for the next non-empty tile costs a few 16-byte loads per lane per 32
// tiles.
#pragma once

#include <climits>
#include <cstdint>
#include <type_traits>

#include "../../attention_mask.h"
#include "../../attention_params.h"
#include "warp_mma.cuh"

namespace jax_flash::cuda_kernels::tensor_core {

// One side's per-token inputs for one batch row: pointers at the row's first token and first chunk summary (ids
// and positions null when absent) and the count of live tokens, min(seq, length) and at least 0.
struct TokenRow {
  const int32_t* segment_ids;
  const int32_t* positions;
  const TokenChunk* chunks;
  int live;
};

__device__ __forceinline__ TokenRow token_row(const int32_t* lengths, const int32_t* segment_ids,
                                              const int32_t* positions, const TokenChunk* chunks, int64_t seq,
                                              int64_t batch) {
  int64_t live = lengths && lengths[batch] < seq ? lengths[batch] : seq;
  return {segment_ids ? segment_ids + batch * seq : nullptr, positions ? positions + batch * seq : nullptr,
          chunks + batch * ((seq + kTokenChunk - 1) / kTokenChunk), live > 0 ? static_cast<int>(live) : 0};
}

__device__ __forceinline__ TokenRow query_row(const TokenMask& t, const AttentionShape& shape, int64_t batch) {
  return token_row(t.q_lengths, t.q_segment_ids, t.q_positions, t.q_chunks, shape.seqlen_q, batch);
}

__device__ __forceinline__ TokenRow key_row(const TokenMask& t, const AttentionShape& shape, int64_t batch) {
  return token_row(t.kv_lengths, t.kv_segment_ids, t.kv_positions, t.kv_chunks, shape.seqlen_k, batch);
}

// What the tile walk reads of a row: its chunk summaries and live count, a few registers where a walk keeps it.
struct ChunkRow {
  const TokenChunk* chunks;
  int live;
  __device__ ChunkRow(const TokenRow& row) : chunks(row.chunks), live(row.live) {}  // NOLINT: implicit on purpose
};

// The summary of tokens [begin, end) of a row: which are live, and the ranges of their segment ids and positions.
struct TokenSpan {
  int begin;
  int live_end;  // tokens [begin, live_end) are live; none when live_end <= begin
  bool whole;    // every token of [begin, end) is live
  int segment_min, segment_max;
  int position_min, position_max;
};

// Read from the chunk summaries that cover [begin, end). A chunk reaching past either end adds tokens outside the
// span to its ranges; wider ranges only turn answers of classify into kPartial, which is always correct. The loads
// go kChunksAtOnce at a time, in flight together (indices past the last chunk read the last one again, which leaves
// the ranges as they are): more round trips overlap, for more registers, which a walk with few (a Hopper producer
// at 24) cannot spare.
template <int kChunksAtOnce>
__device__ __forceinline__ TokenSpan chunk_span(const ChunkRow& row, int begin, int end) {
  TokenSpan span;
  span.begin = begin;
  span.live_end = end < row.live ? end : row.live;
  span.whole = span.live_end == end;
  span.segment_min = span.position_min = INT_MAX;
  span.segment_max = span.position_max = INT_MIN;
  const int last = (span.live_end - 1) / kTokenChunk;
#pragma unroll 1
  for (int first = begin / kTokenChunk; first <= last && begin < span.live_end; first += kChunksAtOnce) {
    int4 summaries[kChunksAtOnce];
#pragma unroll
    for (int i = 0; i < kChunksAtOnce; ++i) {  // TokenChunk's four fields
      summaries[i] = __ldg(reinterpret_cast<const int4*>(row.chunks + min(first + i, last)));
    }
#pragma unroll
    for (int i = 0; i < kChunksAtOnce; ++i) {
      span.segment_min = min(span.segment_min, summaries[i].x);
      span.segment_max = max(span.segment_max, summaries[i].y);
      span.position_min = min(span.position_min, summaries[i].z);
      span.position_max = max(span.position_max, summaries[i].w);
    }
  }
  return span;
}

// kUniform: every token of both tiles is live and of one segment, but the window may hide some pairs. Where the
// window applies to token indices (no positions given), a kernel may mask such a tile with the window's rule alone,
// which is cheaper than the per-token test of a kPartial tile (the diagonal tiles of causal documents).
enum class TileKind { kEmpty, kPartial, kUniform, kFull };

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
  if (!(q.whole && k.whole && one_segment)) return TileKind::kPartial;
  return inside_window ? TileKind::kFull : TileKind::kUniform;
}

// The two sides of a block's walk: its own tile (query rows, or keys for dk/dv) and the row of the side it walks in
// tiles of `walked_tile` tokens. Kernels build it only when the walk needs new tiles classified, so none of it stays
// in registers across their main loops.
struct WalkSides {
  ChunkRow own;
  int own_begin, own_end;
  ChunkRow walked;
  int walked_tile;
  bool walked_are_keys;
  // The own tile's summary, read once, for a walk that classifies many windows against one own tile (a Hopper
  // backward CTA walks a whole row): each window then waits only for the walked side's loads. Null: read per window.
  const TokenSpan* own_span = nullptr;
};

// The walked side's non-empty tiles in increasing order, classified 32 at a time (a search may restart lower, e.g.
// for the next head of a GQA group), reading kChunksAtOnce chunk summaries per round trip (chunk_span).
template <int kChunksAtOnce = 1>
class TileWalk {
 public:
  // The first non-empty tile in [tile, end), or end if none.
  __device__ __forceinline__ int64_t first_visible(int64_t tile, int64_t end, const WalkSides& sides,
                                                   const AttentionMask& mask) {
    // Tile indices fit 32 bits (sequences are shorter than 2^31 tokens); the state then takes four registers.
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
  // Whether it is kUniform (see TileKind).
  __device__ __forceinline__ bool uniform(int64_t tile) const { return (uniform_ >> (tile - base_)) & 1u; }

 private:
  __device__ __forceinline__ void classify_window(int base, int64_t end, const WalkSides& sides,
                                                  const AttentionMask& mask) {
    base_ = base;
    const TokenSpan own =
        sides.own_span ? *sides.own_span : chunk_span<kChunksAtOnce>(sides.own, sides.own_begin, sides.own_end);
    const int64_t tile = base + threadIdx.x % 32;
    TileKind kind = TileKind::kEmpty;
    if (tile < end) {
      const int begin = static_cast<int>(tile * sides.walked_tile);
      const TokenSpan walked = chunk_span<kChunksAtOnce>(sides.walked, begin, begin + sides.walked_tile);
      kind = sides.walked_are_keys ? classify(own, walked, mask) : classify(walked, own, mask);
    }
    visible_ = __ballot_sync(0xffffffffu, kind != TileKind::kEmpty);
    full_ = __ballot_sync(0xffffffffu, kind == TileKind::kFull);
    uniform_ = __ballot_sync(0xffffffffu, kind == TileKind::kUniform);
  }

  static constexpr int kWindow = 32;  // a tile per lane

  int base_ = -kWindow;  // the window [base_, base_ + kWindow) holds no tile before the first search
  unsigned visible_ = 0;
  unsigned full_ = 0;
  unsigned uniform_ = 0;
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
