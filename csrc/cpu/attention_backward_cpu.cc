// CPU backward. Each task owns (batch, kv head, a chunk of key tiles): it recomputes P for every query row and every
// query head of the GQA group that sees those keys, so dK and dV are summed over the group without races. dQ gets
// contributions from every key chunk, so each chunk accumulates into its own float32 buffer and a final pass sums
// the chunks in a fixed order: the result is deterministic.
#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "../attention_mask.h"
#include "attention_cpu.h"
#include "float_convert.h"
#include "tile_math.h"
#include "tiling.h"
#include "token_blocks.h"

namespace jax_flash {
namespace {

using cpu::kKeyTile;
using cpu::kQueryTile;

struct BackwardScratch {
  explicit BackwardScratch(int64_t d)
      : k(kKeyTile * d), k_t(d * kKeyTile), dk(kKeyTile * d), dv(kKeyTile * d), q(kQueryTile * d),
        dout(kQueryTile * d), s(kQueryTile * kKeyTile), ds(kQueryTile * kKeyTile), transposed(kKeyTile * kQueryTile),
        row(d), v_t_wide(d * kKeyTile), dout_wide(kQueryTile * d), dp(kQueryTile * kKeyTile) {}
  std::vector<float> k, k_t, dk, dv, q, dout, s, ds, transposed, row;
  std::vector<double> v_t_wide, dout_wide, dp;
};

// delta[b, h, i] = sum_d dout * out: the softmax-gradient correction of row i. dS = P (dP - delta) subtracts two
// sums that agree in most of their digits when a few keys carry the row, so both are summed in double (the
// difference keeps float32's precision, as XLA's autodiff keeps it by summing P dP), by the same GEMM in the same
// order, so a row whose output is one value row (a single visible key: P = 1) gets dP - delta = 0 and a zero dQ, as
// the exact gradient and XLA's autodiff do.
void compute_delta(const AttentionBackwardParams& p, double* delta, const ParallelFor& parallel_for) {
  const AttentionShape& sh = p.shape;
  const int64_t d = sh.head_dim;
  parallel_for(sh.batch * sh.seqlen_q, [&](int64_t bi) {
    std::vector<float> dout(d), out(d);
    std::vector<double> dout_wide(d), out_wide(d);
    const int64_t b = bi / sh.seqlen_q, i = bi % sh.seqlen_q;
    for (int64_t h = 0; h < sh.heads_q; ++h) {
      const int64_t offset = ((b * sh.seqlen_q + i) * sh.heads_q + h) * d;
      cpu::load_floats(p.dtype, p.dout, offset, d, 1.f, dout.data());
      cpu::load_floats(p.dtype, p.out, offset, d, 1.f, out.data());
      std::copy(dout.begin(), dout.end(), dout_wide.begin());
      std::copy(out.begin(), out.end(), out_wide.begin());
      double sum = 0.0;
      cpu::gemm_accumulate(&sum, 1, dout_wide.data(), d, out_wide.data(), 1, 1, 1, d);
      delta[(b * sh.heads_q + h) * sh.seqlen_q + i] = sum;
    }
  });
}

// One key tile [j0, j0 + cols) of kv head hk against one query tile [i0, i0 + rows) of query head h. Unless
// fully_visible, each element is tested: by `blocks` (the per-token inputs) when given, else by the window.
void backward_block(const AttentionBackwardParams& p, const double* delta, int64_t b, int64_t h, int64_t i0,
                    int64_t rows, int64_t j0, int64_t cols, bool fully_visible, const cpu::TokenBlocks* blocks,
                    BackwardScratch& t, float* dq_accum) {
  const AttentionShape& sh = p.shape;
  const int64_t d = sh.head_dim;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t offset = ((b * sh.seqlen_q + i0 + r) * sh.heads_q + h) * d;
    cpu::load_floats(p.dtype, p.q, offset, d, p.scale, &t.q[r * d]);
    cpu::load_floats(p.dtype, p.dout, offset, d, 1.f, &t.dout[r * d]);
  }
  std::copy(t.dout.begin(), t.dout.begin() + rows * d, t.dout_wide.begin());
  // S = (scale Q) K^T, then P = exp(capped(S) - lse), zero where masked.
  std::fill(t.s.begin(), t.s.begin() + rows * kKeyTile, 0.f);
  cpu::gemm_accumulate(t.s.data(), kKeyTile, t.q.data(), d, t.k_t.data(), kKeyTile, rows, cols, d);
  const float* lse = p.lse + (b * sh.heads_q + h) * sh.seqlen_q + i0;
  for (int64_t r = 0; r < rows; ++r) {
    float* s = &t.s[r * kKeyTile];
    for (int64_t c = 0; c < cols; ++c) {
      const bool visible = fully_visible || (blocks ? blocks->visible(b, i0 + r, j0 + c)
                                                    : key_visible(p.mask, i0 + r, j0 + c));
      s[c] = visible ? capped_logit(s[c], p.mask.softcap) : -INFINITY;
    }
    // Rows that saw no key in the forward have lse = -inf; all their logits here are masked too.
    if (lse[r] == -INFINITY)
      std::fill(s, s + cols, 0.f);
    else
      cpu::exp_shifted_sum(s, cols, lse[r]);
  }
  // dV += P^T dO
  cpu::transpose(t.s.data(), kKeyTile, rows, cols, t.transposed.data(), kQueryTile);
  cpu::gemm_accumulate(t.dv.data(), d, t.transposed.data(), kQueryTile, t.dout.data(), d, cols, d, rows);
  // dP = dO V^T (double), then dS = P (dP - delta) scaled by the soft-cap slope.
  std::fill(t.dp.begin(), t.dp.begin() + rows * kKeyTile, 0.0);
  cpu::gemm_accumulate(t.dp.data(), kKeyTile, t.dout_wide.data(), d, t.v_t_wide.data(), kKeyTile, rows, cols, d);
  const double* row_delta = delta + (b * sh.heads_q + h) * sh.seqlen_q + i0;
  for (int64_t r = 0; r < rows; ++r) {
    const double* dp = &t.dp[r * kKeyTile];
    const float* prob = &t.s[r * kKeyTile];
    float* ds = &t.ds[r * kKeyTile];
    for (int64_t c = 0; c < cols; ++c) {
      ds[c] = prob[c] * float(dp[c] - row_delta[r]);
      // The slope needs the capped logit, which is lse + log(p); only computed when a cap is set.
      if (p.mask.softcap > 0.f && prob[c] > 0.f)
        ds[c] *= capped_logit_slope(lse[r] + std::log(prob[c]), p.mask.softcap);
    }
  }
  // dK += dS^T (scale Q); dQ (before the final scale) += dS K.
  cpu::transpose(t.ds.data(), kKeyTile, rows, cols, t.transposed.data(), kQueryTile);
  cpu::gemm_accumulate(t.dk.data(), d, t.transposed.data(), kQueryTile, t.q.data(), d, cols, d, rows);
  cpu::gemm_accumulate(dq_accum + ((b * sh.seqlen_q + i0) * sh.heads_q + h) * d, sh.heads_q * d, t.ds.data(),
                       kKeyTile, t.k.data(), d, rows, d, cols);
}

}  // namespace

void attention_backward_cpu(const AttentionBackwardParams& p, int64_t num_threads, const ParallelFor& parallel_for) {
  const AttentionShape& sh = p.shape;
  const int64_t d = sh.head_dim, group = sh.group();
  const int64_t q_elements = sh.batch * sh.seqlen_q * sh.heads_q * d;

  std::optional<cpu::TokenBlocks> blocks;
  if (p.tokens.any()) blocks.emplace(sh, p.mask, p.tokens);
  std::vector<double> delta(sh.batch * sh.heads_q * sh.seqlen_q);
  compute_delta(p, delta.data(), parallel_for);

  // Enough key chunks to give every thread about two tasks; each chunk has a private dQ accumulator.
  const int64_t key_tiles = (sh.seqlen_k + kKeyTile - 1) / kKeyTile;
  const int64_t heads = sh.batch * sh.heads_kv;
  const int64_t chunks = std::clamp<int64_t>((2 * std::max<int64_t>(num_threads, 1) + heads - 1) / heads, 1, key_tiles);
  const int64_t tiles_per_chunk = (key_tiles + chunks - 1) / chunks;
  std::vector<float> dq_accum(chunks * q_elements, 0.f);

  parallel_for(heads * chunks, [&](int64_t task) {
    const int64_t chunk = task % chunks, b = task / chunks / sh.heads_kv, hk = task / chunks % sh.heads_kv;
    BackwardScratch t(d);
    float* chunk_dq = dq_accum.data() + chunk * q_elements;
    const int64_t tile_end = std::min(key_tiles, (chunk + 1) * tiles_per_chunk);
    for (int64_t tile = chunk * tiles_per_chunk; tile < tile_end; ++tile) {
      const int64_t j0 = tile * kKeyTile, cols = std::min(kKeyTile, sh.seqlen_k - j0);
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t offset = ((b * sh.seqlen_k + j0 + c) * sh.heads_kv + hk) * d;
        cpu::load_floats(p.dtype, p.k, offset, d, 1.f, &t.k[c * d]);
        cpu::load_floats(p.dtype, p.v, offset, d, 1.f, t.row.data());
        for (int64_t x = 0; x < d; ++x) {
          t.k_t[x * kKeyTile + c] = t.k[c * d + x];
          t.v_t_wide[x * kKeyTile + c] = t.row[x];
        }
      }
      std::fill(t.dk.begin(), t.dk.end(), 0.f);
      std::fill(t.dv.begin(), t.dv.end(), 0.f);
      if (blocks) {
        // Query tiles on the grid the block summaries describe; the empty ones are skipped.
        for (int64_t g = 0; g < group; ++g)
          for (int64_t query_tile = 0; query_tile < blocks->query_tiles(); ++query_tile) {
            const cpu::BlockKind kind = blocks->classify(b, query_tile, tile);
            if (kind == cpu::BlockKind::kEmpty) continue;
            const int64_t i0 = query_tile * kQueryTile;
            backward_block(p, delta.data(), b, hk * group + g, i0, std::min(kQueryTile, sh.seqlen_q - i0), j0, cols,
                           kind == cpu::BlockKind::kFull, &*blocks, t, chunk_dq);
          }
      } else {
        // The window bounds the rows that see this key tile to one range.
        const int64_t row_begin = first_row_seeing(p.mask, j0);
        const int64_t row_end = end_row_seeing(p.mask, j0 + cols, sh.seqlen_q);
        for (int64_t g = 0; g < group; ++g)
          for (int64_t i0 = row_begin; i0 < row_end; i0 += kQueryTile) {
            const int64_t rows = std::min(kQueryTile, row_end - i0);
            // The visible band is convex, so two corners decide whether the block needs a mask.
            const bool fully_visible =
                key_visible(p.mask, i0 + rows - 1, j0) && key_visible(p.mask, i0, j0 + cols - 1);
            backward_block(p, delta.data(), b, hk * group + g, i0, rows, j0, cols, fully_visible, nullptr, t,
                           chunk_dq);
          }
      }
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t offset = ((b * sh.seqlen_k + j0 + c) * sh.heads_kv + hk) * d;
        cpu::store_floats(p.dtype, &t.dk[c * d], 1.f, d, p.dk, offset);
        cpu::store_floats(p.dtype, &t.dv[c * d], 1.f, d, p.dv, offset);
      }
    }
  });

  // dq = scale * sum over chunks, in chunk order.
  const int64_t row = sh.heads_q * d;
  parallel_for(sh.batch * sh.seqlen_q, [&](int64_t r) {
    std::vector<float> sum(dq_accum.begin() + r * row, dq_accum.begin() + (r + 1) * row);
    for (int64_t c = 1; c < chunks; ++c)
      for (int64_t x = 0; x < row; ++x) sum[x] += dq_accum[c * q_elements + r * row + x];
    cpu::store_floats(p.dtype, sum.data(), p.scale, row, p.dq, r * row);
  });
}

}  // namespace jax_flash
