// CPU forward: each task owns one (batch, query head, query tile) and streams over the visible key tiles with an
// online softmax, so memory stays O(tile) per thread and the S x S matrix never exists.
#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "../attention_mask.h"
#include "attention_cpu.h"
#include "float_convert.h"
#include "online_softmax.h"
#include "tile_math.h"
#include "tiling.h"
#include "token_blocks.h"

namespace jax_flash {
namespace {

using cpu::kKeyTile;
using cpu::kQueryTile;

struct ForwardScratch {
  explicit ForwardScratch(int64_t d)
      : q(kQueryTile * d), k_t(d * kKeyTile), v(kKeyTile * d), s(kQueryTile * kKeyTile), o(kQueryTile * d),
        row_max(kQueryTile), row_sum(kQueryTile) {}
  std::vector<float> q, k_t, v, s, o, row_max, row_sum;
};

// `blocks` is null without per-token inputs; the window alone then decides which keys and elements are visible.
void forward_tile(const AttentionForwardParams& p, int64_t b, int64_t h, int64_t query_tile, ForwardScratch& t,
                  const cpu::TokenBlocks* blocks) {
  const AttentionShape& sh = p.shape;
  const int64_t row_begin = query_tile * kQueryTile;
  const int64_t d = sh.head_dim, hk = h / sh.group();
  const int64_t row_end = std::min(row_begin + kQueryTile, sh.seqlen_q), rows = row_end - row_begin;

  // Q is pre-multiplied by the scale so Q K^T is directly the raw logit.
  for (int64_t r = 0; r < rows; ++r)
    cpu::load_floats(p.dtype, p.q, ((b * sh.seqlen_q + row_begin + r) * sh.heads_q + h) * d, d, p.scale, &t.q[r * d]);
  std::fill(t.o.begin(), t.o.begin() + rows * d, 0.f);
  std::fill(t.row_max.begin(), t.row_max.end(), -INFINITY);
  std::fill(t.row_sum.begin(), t.row_sum.end(), 0.f);

  // Per-token inputs can hide any block, so then every key tile of the grid the block summaries describe is
  // classified; the window alone bounds the visible keys to one range.
  const int64_t key_begin = blocks ? 0 : first_visible_key(p.mask, row_begin);
  const int64_t key_end = blocks ? sh.seqlen_k : end_visible_key(p.mask, row_end, sh.seqlen_k);
  std::vector<float> key_row(d);
  for (int64_t j0 = key_begin; j0 < key_end; j0 += kKeyTile) {
    const int64_t cols = std::min(kKeyTile, key_end - j0);
    // The visible band j - i in [-left, right] is convex, so two corners decide whether the tile needs a mask.
    const cpu::BlockKind kind =
        blocks ? blocks->classify(b, query_tile, j0 / kKeyTile)
               : (key_visible(p.mask, row_end - 1, j0) && key_visible(p.mask, row_begin, j0 + cols - 1)
                      ? cpu::BlockKind::kFull
                      : cpu::BlockKind::kPartial);
    if (kind == cpu::BlockKind::kEmpty) continue;
    const bool fully_visible = kind == cpu::BlockKind::kFull;
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t kv_offset = ((b * sh.seqlen_k + j0 + c) * sh.heads_kv + hk) * d;
      cpu::load_floats(p.dtype, p.k, kv_offset, d, 1.f, key_row.data());
      for (int64_t x = 0; x < d; ++x) t.k_t[x * kKeyTile + c] = key_row[x];
      cpu::load_floats(p.dtype, p.v, kv_offset, d, 1.f, &t.v[c * d]);
    }
    std::fill(t.s.begin(), t.s.begin() + rows * kKeyTile, 0.f);
    cpu::gemm_accumulate(t.s.data(), kKeyTile, t.q.data(), d, t.k_t.data(), kKeyTile, rows, cols, d);

    for (int64_t r = 0; r < rows; ++r) {
      float* s = &t.s[r * kKeyTile];
      float tile_max = -INFINITY;
      for (int64_t c = 0; c < cols; ++c) {
        float logit = capped_logit(s[c], p.mask.softcap);
        if (!fully_visible && !(blocks ? blocks->visible(b, row_begin + r, j0 + c)
                                       : key_visible(p.mask, row_begin + r, j0 + c)))
          logit = -INFINITY;
        s[c] = logit;
        tile_max = std::max(tile_max, logit);
      }
      cpu::online_softmax_step(s, cols, tile_max, t.row_max[r], t.row_sum[r], &t.o[r * d], d);
    }
    cpu::gemm_accumulate(t.o.data(), d, t.s.data(), kKeyTile, t.v.data(), d, rows, d, cols);
  }

  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = row_begin + r;
    const float sum = t.row_sum[r];
    // A row with no visible key has sum 0: output 0 and lse -inf instead of 0/0.
    cpu::store_floats(p.dtype, &t.o[r * d], sum > 0.f ? 1.f / sum : 0.f, d, p.out,
                      ((b * sh.seqlen_q + i) * sh.heads_q + h) * d);
    p.lse[(b * sh.heads_q + h) * sh.seqlen_q + i] = sum > 0.f ? t.row_max[r] + std::log(sum) : -INFINITY;
  }
}

}  // namespace

void attention_forward_cpu(const AttentionForwardParams& p, int64_t /*num_threads*/, const ParallelFor& parallel_for) {
  const AttentionShape& sh = p.shape;
  const int64_t query_tiles = (sh.seqlen_q + kQueryTile - 1) / kQueryTile;
  std::optional<cpu::TokenBlocks> blocks;
  if (p.tokens.any()) blocks.emplace(sh, p.mask, p.tokens);
  parallel_for(sh.batch * sh.heads_q * query_tiles, [&](int64_t task) {
    const int64_t tile = task % query_tiles, bh = task / query_tiles;
    ForwardScratch scratch(sh.head_dim);
    forward_tile(p, bh / sh.heads_q, bh % sh.heads_q, tile, scratch, blocks ? &*blocks : nullptr);
  });
}

}  // namespace jax_flash
