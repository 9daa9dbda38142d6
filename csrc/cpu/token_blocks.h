// Block skipping for the per-token inputs (lengths, segment ids, positions): which (query tile, key tile) blocks of a
// call are empty, fully visible or need a per-element mask. Each tile's segment-id and position ranges are
// summarized once per call, so the forward and backward tasks classify a block in O(1).
#pragma once

#include <cstdint>
#include <vector>

#include "../attention_mask.h"
#include "../attention_params.h"

namespace jax_flash::cpu {

enum class BlockKind { kEmpty, kPartial, kFull };

class TokenBlocks {
 public:
  TokenBlocks(const AttentionShape& shape, const AttentionMask& mask, const TokenMask& tokens);

  // The block of batch row b made of query tile `query_tile` (rows from query_tile * kQueryTile) and key tile
  // `key_tile` (keys from key_tile * kKeyTile). Conservative: kPartial is always a correct answer.
  BlockKind classify(int64_t b, int64_t query_tile, int64_t key_tile) const;

  // The element test inside a partial block.
  bool visible(int64_t b, int64_t i, int64_t j) const { return token_visible(mask_, tokens_, shape_, b, i, j); }

  int64_t query_tiles() const { return query_tiles_; }

 private:
  struct Range {
    int64_t min, max;
  };

  AttentionShape shape_;
  AttentionMask mask_;
  TokenMask tokens_;
  int64_t query_tiles_, key_tiles_;
  // [batch, tiles] ranges; empty when the input is absent.
  std::vector<Range> q_segments_, kv_segments_, q_positions_, kv_positions_;
};

}  // namespace jax_flash::cpu
