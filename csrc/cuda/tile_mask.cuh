// The per-element visibility test inside one (query tile, key tile) pair that straddles a sequence end or a window
// edge. key_visible (attention_mask.h) states the rule on 64-bit absolute positions, which compiles to a branch per
// element; in the unrolled loops over an accumulator that made the loop bodies branchy and too large for the
// instruction cache. Here the tile's bounds are folded into three int32 limits once per tile, so each element costs
// three compares of its tile-relative coordinates, which are compile-time constants after unrolling.
#pragma once

#include <cstdint>

#include "../attention_mask.h"

namespace jax_flash::cuda_kernels {

struct TileMask {
  int key_end;                   // tile-relative keys at or past it lie beyond seqlen_k
  int offset_low, offset_high;   // visible when offset_low <= key - query <= offset_high (tile-relative)

  __device__ TileMask(const AttentionMask& mask, int64_t seqlen_k, int64_t query_begin, int64_t key_begin) {
    // Tile-relative offsets are within +-kTileReach; clamping the limits there keeps them in int32.
    constexpr int64_t kTileReach = 1 << 20;
    auto clamp = [](int64_t x) { return int(x < -kTileReach ? -kTileReach : x > kTileReach ? kTileReach : x); };
    const int64_t tile_offset = key_begin - query_begin;
    key_end = clamp(seqlen_k - key_begin);
    offset_low = mask.window_left < 0 ? -int(kTileReach) : clamp(-mask.window_left - tile_offset);
    offset_high = mask.window_right < 0 ? int(kTileReach) : clamp(mask.window_right - tile_offset);
  }

  // Same answer as `key < seqlen_k && key_visible(mask, query, key)` for the absolute positions
  // query_begin + query and key_begin + key.
  __device__ __forceinline__ bool visible(int query, int key) const {
    const int offset = key - query;
    return key < key_end && offset >= offset_low && offset <= offset_high;
  }

  // The tile-relative keys [first, last] that query `query` sees: two compares per element of a row.
  struct KeyRange {
    int first, last;
  };
  __device__ __forceinline__ KeyRange keys_seen_by(int query) const {
    return {query + offset_low, min(query + offset_high, key_end - 1)};
  }
};

}  // namespace jax_flash::cuda_kernels
