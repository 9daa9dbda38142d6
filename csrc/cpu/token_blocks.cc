#include "token_blocks.h"

#include <algorithm>

#include "tiling.h"

namespace jax_flash::cpu {
namespace {

// Min and max of values[b, tile * tile_size, ...] for every batch row and tile; empty for a null input.
template <typename Range>
std::vector<Range> summarize(const int32_t* values, int64_t batch, int64_t seq, int64_t tile_size, int64_t tiles) {
  std::vector<Range> ranges;
  if (values == nullptr) return ranges;
  ranges.reserve(batch * tiles);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t tile = 0; tile < tiles; ++tile) {
      const int32_t* begin = values + b * seq + tile * tile_size;
      const auto [lo, hi] = std::minmax_element(begin, begin + std::min(tile_size, seq - tile * tile_size));
      ranges.push_back(Range{*lo, *hi});
    }
  return ranges;
}

}  // namespace

TokenBlocks::TokenBlocks(const AttentionShape& shape, const AttentionMask& mask, const TokenMask& tokens)
    : shape_(shape),
      mask_(mask),
      tokens_(tokens),
      query_tiles_((shape.seqlen_q + kQueryTile - 1) / kQueryTile),
      key_tiles_((shape.seqlen_k + kKeyTile - 1) / kKeyTile),
      q_segments_(summarize<Range>(tokens.q_segment_ids, shape.batch, shape.seqlen_q, kQueryTile, query_tiles_)),
      kv_segments_(summarize<Range>(tokens.kv_segment_ids, shape.batch, shape.seqlen_k, kKeyTile, key_tiles_)),
      q_positions_(summarize<Range>(tokens.q_positions, shape.batch, shape.seqlen_q, kQueryTile, query_tiles_)),
      kv_positions_(summarize<Range>(tokens.kv_positions, shape.batch, shape.seqlen_k, kKeyTile, key_tiles_)) {}

BlockKind TokenBlocks::classify(int64_t b, int64_t query_tile, int64_t key_tile) const {
  // Rows and keys past the lengths see nothing; the block is empty when one side has none left.
  const int64_t row_begin = query_tile * kQueryTile, key_begin = key_tile * kKeyTile;
  const int64_t row_end = std::min(row_begin + kQueryTile, shape_.seqlen_q);
  const int64_t key_end = std::min(key_begin + kKeyTile, shape_.seqlen_k);
  const int64_t live_row_end = tokens_.q_lengths ? std::min<int64_t>(row_end, tokens_.q_lengths[b]) : row_end;
  const int64_t live_key_end = tokens_.kv_lengths ? std::min<int64_t>(key_end, tokens_.kv_lengths[b]) : key_end;
  if (live_row_end <= row_begin || live_key_end <= key_begin) return BlockKind::kEmpty;
  bool full = live_row_end == row_end && live_key_end == key_end;

  if (!q_segments_.empty()) {
    const Range q = q_segments_[b * query_tiles_ + query_tile], k = kv_segments_[b * key_tiles_ + key_tile];
    if (q.max < k.min || k.max < q.min) return BlockKind::kEmpty;
    full = full && q.min == q.max && k.min == k.max && q.min == k.min;
  }

  // The window compares positions: given ones (ranges over the whole tile), else the live indices themselves.
  const Range q =
      q_positions_.empty() ? Range{row_begin, live_row_end - 1} : q_positions_[b * query_tiles_ + query_tile];
  const Range k =
      kv_positions_.empty() ? Range{key_begin, live_key_end - 1} : kv_positions_[b * key_tiles_ + key_tile];
  const int64_t left = mask_.window_left, right = mask_.window_right;
  if ((left >= 0 && k.max < q.min - left) || (right >= 0 && k.min > q.max + right)) return BlockKind::kEmpty;
  full = full && (left < 0 || k.min >= q.max - left) && (right < 0 || k.max <= q.min + right);
  return full ? BlockKind::kFull : BlockKind::kPartial;
}

}  // namespace jax_flash::cpu
