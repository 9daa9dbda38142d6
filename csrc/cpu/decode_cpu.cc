// CPU decode, split-KV like the CUDA kernel: a task owns one (sequence, kv head, block of packed query rows, key
// split). Packed rows are every query head of the kv head at every new position (row = i * group + g), so each K/V
// tile is loaded once for all of them. Splits give the thread pool work when batch x kv_heads is small; each writes
// a normalised partial output and its lse, and a second pass merges the splits.
#include <algorithm>
#include <cmath>
#include <vector>

#include "decode_cpu.h"
#include "float_convert.h"
#include "online_softmax.h"
#include "tile_math.h"
#include "tiling.h"

namespace jax_flash {
namespace {

using cpu::kKeyTile;
using cpu::kQueryTile;

// A split shorter than this many keys costs more in merging than it gains in parallelism.
constexpr int64_t kMinKeysPerSplit = 8 * kKeyTile;

struct Partials {
  int64_t splits;
  int64_t rows;  // batch * q_len * heads_q, in the layout of out
  std::vector<float> o;    // [splits, rows, head_dim], normalised
  std::vector<float> lse;  // [splits, rows]
};

struct Scratch {
  explicit Scratch(int64_t d)
      : q(kQueryTile * d), k_t(d * kKeyTile), v(kKeyTile * d), s(kQueryTile * kKeyTile), o(kQueryTile * d),
        row_max(kQueryTile), row_sum(kQueryTile), key_row(d) {}
  std::vector<float> q, k_t, v, s, o, row_max, row_sum, key_row;
};

// Index of packed row r (query i = r / group, head hk * group + r % group) in the out layout.
int64_t out_row(const DecodeParams& p, int64_t b, int64_t hk, int64_t r) {
  const int64_t group = p.group();
  return (b * p.q_len + r / group) * p.heads_q + hk * group + r % group;
}

void decode_task(const DecodeParams& p, int64_t b, int64_t hk, int64_t row_begin, int64_t split, Partials& out,
                 Scratch& t) {
  const int64_t d = p.cache.head_dim, group = p.group();
  const int64_t row_end = std::min(row_begin + kQueryTile, p.q_len * group), rows = row_end - row_begin;
  const int64_t length = p.length(b), first_position = length - p.q_len;

  for (int64_t r = 0; r < rows; ++r)
    cpu::load_floats(p.dtype, p.q, out_row(p, b, hk, row_begin + r) * d, d, p.scale, &t.q[r * d]);
  std::fill(t.o.begin(), t.o.begin() + rows * d, 0.f);
  std::fill(t.row_max.begin(), t.row_max.end(), -INFINITY);
  std::fill(t.row_sum.begin(), t.row_sum.end(), 0.f);

  // Keys any row of the block may see, then this split's share of them.
  const int64_t lowest = first_position + row_begin / group, highest = first_position + (row_end - 1) / group;
  const int64_t begin = first_visible_key(p.mask, std::max<int64_t>(lowest, 0));
  const int64_t end = std::min(highest + 1, length);
  const int64_t chunk = (std::max<int64_t>(end - begin, 0) + out.splits - 1) / out.splits;
  const int64_t key_begin = begin + split * chunk, key_end = std::min(end, key_begin + chunk);

  for (int64_t j0 = key_begin; j0 < key_end; j0 += kKeyTile) {
    const int64_t cols = std::min(kKeyTile, key_end - j0);
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t offset = p.cache.offset(b, j0 + c, hk);
      cpu::load_floats(p.dtype, p.k, offset, d, 1.f, t.key_row.data());
      for (int64_t x = 0; x < d; ++x) t.k_t[x * kKeyTile + c] = t.key_row[x];
      cpu::load_floats(p.dtype, p.v, offset, d, 1.f, &t.v[c * d]);
    }
    std::fill(t.s.begin(), t.s.begin() + rows * kKeyTile, 0.f);
    cpu::gemm_accumulate(t.s.data(), kKeyTile, t.q.data(), d, t.k_t.data(), kKeyTile, rows, cols, d);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t position = first_position + (row_begin + r) / group;
      float* s = &t.s[r * kKeyTile];
      float tile_max = -INFINITY;
      for (int64_t c = 0; c < cols; ++c) {
        s[c] = key_visible(p.mask, position, j0 + c) ? capped_logit(s[c], p.mask.softcap) : -INFINITY;
        tile_max = std::max(tile_max, s[c]);
      }
      cpu::online_softmax_step(s, cols, tile_max, t.row_max[r], t.row_sum[r], &t.o[r * d], d);
    }
    cpu::gemm_accumulate(t.o.data(), d, t.s.data(), kKeyTile, t.v.data(), d, rows, d, cols);
  }

  for (int64_t r = 0; r < rows; ++r) {
    const int64_t index = split * out.rows + out_row(p, b, hk, row_begin + r);
    // A sum of 0: no visible key (output 0, lse -inf). A NaN sum (a NaN among the visible entries) stays NaN, in the
    // lse too, so the merge passes it on as the forward and jax.nn do.
    const float sum = t.row_sum[r];
    const bool seen = !(sum == 0.f);
    const float inverse = seen ? 1.f / sum : 0.f;
    for (int64_t x = 0; x < d; ++x) out.o[index * d + x] = t.o[r * d + x] * inverse;
    out.lse[index] = seen ? t.row_max[r] + std::log(sum) : -INFINITY;
  }
}

// Merges the splits of one output row: weights exp(lse_s - max lse) over normalised partials.
void merge_row(const DecodeParams& p, const Partials& parts, int64_t row, std::vector<float>& acc) {
  const int64_t d = p.cache.head_dim;
  // A NaN partial (a NaN among its visible entries) makes the maximum NaN, and through the weights the row's output
  // and lse; only a row where no split saw anything skips the sum.
  float max_lse = -INFINITY;
  for (int64_t s = 0; s < parts.splits; ++s) {
    const float lse = parts.lse[s * parts.rows + row];
    max_lse = std::isnan(lse) || std::isnan(max_lse) ? NAN : std::max(max_lse, lse);
  }
  std::fill(acc.begin(), acc.end(), 0.f);
  float total = 0.f;
  if (max_lse != -INFINITY) {
    for (int64_t s = 0; s < parts.splits; ++s) {
      const float weight = std::exp(parts.lse[s * parts.rows + row] - max_lse);
      if (weight == 0.f) continue;
      total += weight;
      for (int64_t x = 0; x < d; ++x) acc[x] += weight * parts.o[(s * parts.rows + row) * d + x];
    }
  }
  cpu::store_floats(p.dtype, acc.data(), total == 0.f ? 0.f : 1.f / total, d, p.out, row * d);
  // out rows are [b, i, h]; lse is [b, h, i].
  const int64_t h = row % p.heads_q, i = (row / p.heads_q) % p.q_len, b = row / (p.heads_q * p.q_len);
  p.lse[(b * p.heads_q + h) * p.q_len + i] = total == 0.f ? -INFINITY : max_lse + std::log(total);
}

}  // namespace

void decode_cpu(const DecodeParams& p, int64_t num_threads, const ParallelFor& parallel_for) {
  const int64_t kv_heads = p.cache.heads_kv;
  const int64_t row_blocks = (p.q_len * p.group() + kQueryTile - 1) / kQueryTile;
  const int64_t base_tasks = p.batch * kv_heads * row_blocks;
  if (base_tasks == 0) return;
  const int64_t wanted = (2 * num_threads + base_tasks - 1) / base_tasks;
  const int64_t splits = std::clamp<int64_t>(wanted, 1, std::max<int64_t>(1, p.cache.capacity() / kMinKeysPerSplit));

  Partials parts{splits, p.batch * p.q_len * p.heads_q, {}, {}};
  parts.o.resize(splits * parts.rows * p.cache.head_dim);
  parts.lse.resize(splits * parts.rows);
  parallel_for(base_tasks * splits, [&](int64_t task) {
    const int64_t split = task % splits, block = (task / splits) % row_blocks;
    const int64_t hk = (task / (splits * row_blocks)) % kv_heads, b = task / (splits * row_blocks * kv_heads);
    Scratch scratch(p.cache.head_dim);
    decode_task(p, b, hk, block * kQueryTile, split, parts, scratch);
  });
  const int64_t rows_per_task = 64;
  parallel_for((parts.rows + rows_per_task - 1) / rows_per_task, [&](int64_t task) {
    std::vector<float> acc(p.cache.head_dim);
    for (int64_t row = task * rows_per_task; row < std::min(parts.rows, (task + 1) * rows_per_task); ++row)
      merge_row(p, parts, row, acc);
  });
}

}  // namespace jax_flash
