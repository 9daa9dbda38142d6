// The tensor-core backward, deterministic and free of atomics: every gradient element is summed in registers by
// the one warp that owns it, in a fixed order, so gradients are bitwise identical run to run.
//
// After delta_i = dout_i . out_i (backward_delta.h), two kernels recompute the probabilities from q, k and the
// forward's lse, each from its own side:
//   dk/dv: a block owns kBlockN keys of one kv head, a warp 16 of them, and walks every query block of every query
//          head of the GQA group that sees them (so k and v are read once and dk, dv summed over the group):
//            s^T = k q^T, dp^T = v dout^T, p^T = exp2(s^T - lse), ds^T = p^T (dp^T - delta) slope,
//            dv += p^T dout, dk += ds^T q.
//          Head dims whose two accumulators would not fit in registers run it twice, once per gradient.
//   dq:    a block owns query rows like the forward and walks the visible key blocks, double-buffered:
//            s = q k^T, dp = dout v^T, ds = p (dp - delta) slope, dq += ds k.
//
// Under a TokenMask both kernels walk the other side's tiles as the forward does (token_tiles.cuh): empty tiles are
// skipped, full ones unmasked, partial ones masked per element; that path is its own instantiation (kTokens), so the
// kernels without one are unchanged.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include <cuda_runtime.h>

#include "../../attention_mask.h"
#include "../../attention_params.h"
#include "../backward_delta.h"
#include "logits.cuh"
#include "query_block.cuh"
#include "generated/tile_configs.h"
#include "launch_with_smem.cuh"
#include "smem_tile.cuh"
#include "../tile_mask.cuh"
#include "token_tiles.cuh"
#include "warp_mma.cuh"

namespace jax_flash::cuda_kernels::tensor_core {

// Which gradients one pass of the dk/dv kernel accumulates.
enum class KeyGradients { kBoth, kValueOnly, kKeyOnly };

template <typename Element, int kHeadDim, TileBudget kBudget>
struct KeyGradientLayout {
  using Config = KeyGradientConfig<kHeadDim, kBudget>;
  static constexpr int kThreads = Config::kWarps * 32;
  static constexpr int kBlockN = Config::kWarps * 16;
  static constexpr int kBlockM = Config::kBlockM;
  using KVTile = SmemTile<Element, kBlockN, kHeadDim>;
  using QTile = SmemTile<Element, kBlockM, kHeadDim>;
  // k, v, then two buffers each of q, dout, the rows' base-2 lse and delta.
  static constexpr int kSmemBytes =
      2 * KVTile::kBytes + 4 * QTile::kBytes + 4 * kBlockM * static_cast<int>(sizeof(float));
  // The token variant's per-thread entry bits add kThreads words of static shared memory.
  static_assert(kBudget == TileBudget::kLarge || kSmemBytes + kThreads * 8 <= kSm86BlockSharedBytes,
                "small tiles must fit 99 KB");
};

template <typename Element, int kHeadDim, TileBudget kBudget, KeyGradients kWhich, bool kTokens>
__global__ void __launch_bounds__(KeyGradientLayout<Element, kHeadDim, kBudget>::kThreads)
    attention_backward_dkdv_kernel(const AttentionBackwardParams params, const float* delta) {
  using Layout = KeyGradientLayout<Element, kHeadDim, kBudget>;
  constexpr int kThreads = Layout::kThreads;
  constexpr int kBlockM = Layout::kBlockM;
  constexpr int kBlockN = Layout::kBlockN;
  constexpr int kDTiles = kHeadDim / 8;
  constexpr int kMTiles = kBlockM / 8;  // queries are the columns of s^T
  constexpr bool kValue = kWhich != KeyGradients::kKeyOnly;
  constexpr bool kKey = kWhich != KeyGradients::kValueOnly;

  extern __shared__ __align__(16) unsigned char shared_bytes[];
  using KVTile = typename Layout::KVTile;
  using QTile = typename Layout::QTile;
  const KVTile k_tile{reinterpret_cast<Element*>(shared_bytes)};
  const KVTile v_tile{k_tile.data + KVTile::kElements};
  // Buffer b of q is q_tiles + b * QTile::kElements; dout, lse and delta follow the same pattern.
  Element* const q_tiles = v_tile.data + KVTile::kElements;
  Element* const dout_tiles = q_tiles + 2 * QTile::kElements;
  float* const lse_log2_rows = reinterpret_cast<float*>(dout_tiles + 2 * QTile::kElements);
  float* const delta_rows = lse_log2_rows + 2 * kBlockM;

  const AttentionShape& shape = params.shape;
  const AttentionMask& mask = params.mask;
  const int head_dim = static_cast<int>(shape.head_dim);
  // Under a causal mask the first key blocks are seen by the most queries; they come first.
  const int64_t n_blocks = (shape.seqlen_k + kBlockN - 1) / kBlockN;
  const int64_t block = blockIdx.x;
  const int64_t n_block = block % n_blocks;
  const int64_t kv_head = block / n_blocks % shape.heads_kv;
  const int64_t batch = block / (n_blocks * shape.heads_kv);
  const int64_t key0 = n_block * kBlockN;
  const int64_t keys = shape.seqlen_k - key0 < kBlockN ? shape.seqlen_k - key0 : kBlockN;
  const int64_t group = (shape.heads_q / shape.heads_kv);

  const int64_t q_stride = shape.heads_q * head_dim;
  const int64_t kv_stride = shape.heads_kv * head_dim;
  const int64_t kv_offset = ((batch * shape.seqlen_k + key0) * shape.heads_kv + kv_head) * head_dim;
  k_tile.template load_async<kThreads>(static_cast<const Element*>(params.k) + kv_offset, kv_stride, keys, head_dim);
  if (kKey)
    v_tile.template load_async<kThreads>(static_cast<const Element*>(params.v) + kv_offset, kv_stride, keys,
                                         head_dim);

  // Given positions, the window applies to them, not to indices: every query block is then a candidate.
  const bool window_on_positions = kTokens && params.tokens.q_positions;
  const int64_t query_begin = window_on_positions ? 0 : first_row_seeing(mask, key0);
  const int64_t query_end =
      window_on_positions ? shape.seqlen_q : end_row_seeing(mask, key0 + keys, shape.seqlen_q);
  const int64_t m_first = query_begin / kBlockM;
  const int64_t m_count = query_end > query_begin ? (query_end + kBlockM - 1) / kBlockM - m_first : 0;
  const int64_t steps = m_count * group;  // (query head, query block) pairs, query blocks innermost

  // Stages step `step`'s q and dout rows with their lse and delta into buffer `buffer`.
  const auto stage = [&](int64_t step, int buffer) {
    const int64_t head = kv_head * group + step / m_count;
    const int64_t query0 = (m_first + step % m_count) * kBlockM;
    const int64_t offset = ((batch * shape.seqlen_q + query0) * shape.heads_q + head) * head_dim;
    const int64_t rows = shape.seqlen_q - query0;
    QTile{q_tiles + buffer * QTile::kElements}.template load_async<kThreads>(
        static_cast<const Element*>(params.q) + offset, q_stride, rows, head_dim);
    QTile{dout_tiles + buffer * QTile::kElements}.template load_async<kThreads>(
        static_cast<const Element*>(params.dout) + offset, q_stride, rows, head_dim);
    for (int r = static_cast<int>(threadIdx.x); r < kBlockM; r += kThreads) {
      const bool valid = r < rows;
      const int64_t stat = (batch * shape.heads_q + head) * shape.seqlen_q + query0 + r;
      lse_log2_rows[buffer * kBlockM + r] = backward_lse_log2(valid, valid ? params.lse[stat] : 0.f);
      delta_rows[buffer * kBlockM + r] = valid ? delta[stat] : 0.f;
    }
  };
  TileWalk<> walk;
  const auto sides = [&] {
    return WalkSides{key_row(params.tokens, shape, batch), static_cast<int>(key0), static_cast<int>(key0 + keys),
                     query_row(params.tokens, shape, batch), kBlockM, false};
  };
  // The first step at or after `step` whose query block is not empty. Emptiness does not depend on the head: a
  // head with no visible block means none has one.
  const auto following = [&](int64_t step) {
    if constexpr (kTokens) {
      for (; step < steps; step = (step / m_count + 1) * m_count) {
        const int64_t m = walk.first_visible(m_first + step % m_count, m_first + m_count, sides(), mask);
        if (m < m_first + m_count) return step - step % m_count + (m - m_first);
        if (step % m_count == 0) break;
      }
      return steps;
    } else {
      return step;
    }
  };
  int64_t step = following(0);
  if (step < steps) stage(step, 0);
  cp_async_commit();

  const int warp_key = static_cast<int>(threadIdx.x) / 32 * 16;
  __shared__ EntryBits<1, kMTiles> token_entries[kTokens ? kThreads : 1];  // a thread's visible_entries
  const LogitTransform logit(params.scale, mask.softcap);
  float dk[1][kDTiles][4] = {};
  float dv[1][kDTiles][4] = {};

  for (int buffer = 0; step < steps; buffer ^= 1) {
    // Taken before the search for the next step, which may move the walk's window past this block.
    const bool tokens_full = kTokens && walk.full(m_first + step % m_count);
    const int64_t next = following(step + 1);
    cp_async_wait<0>();
    __syncthreads();  // this step's rows have landed, and every warp is done with the other buffer
    if (next < steps) stage(next, buffer ^ 1);
    cp_async_commit();
    const QTile q_tile{q_tiles + buffer * QTile::kElements};
    const QTile dout_tile{dout_tiles + buffer * QTile::kElements};
    const float* lse_log2 = lse_log2_rows + buffer * kBlockM;
    const float* row_delta = delta_rows + buffer * kBlockM;
    const int64_t query0 = (m_first + step % m_count) * kBlockM;

    // Through shared memory rather than a register live across the MMAs: at head dims 128 and 256 that register
    // made ptxas spill in the gradient loop.
    if (kTokens)
      token_entries[threadIdx.x] =
          tokens_full ? EntryBits<1, kMTiles>{0}
                      : visible_entries<1, kMTiles, true>(key_row(params.tokens, shape, batch), key0 + warp_key,
                                                          query_row(params.tokens, shape, batch), query0, mask);
    float s[1][kMTiles][4] = {};
    mma_rows_by_rows<Element, 1, kMTiles, kHeadDim / 16>(s, k_tile, warp_key, q_tile, 0);
    float dp[1][kMTiles][4] = {};
    if (kKey) mma_rows_by_rows<Element, 1, kMTiles, kHeadDim / 16>(dp, v_tile, warp_key, dout_tile, 0);

    const bool unmasked =
        kTokens ? tokens_full : tile_inside_window(mask, query0, query0 + kBlockM, key0, key0 + kBlockN);
    // Keys past seqlen_k count as hidden here too; their rows of dk and dv are never stored.
    const TileMask tile_mask(mask, shape.seqlen_k, query0, key0 + warp_key);
    const auto to_gradients = [&](auto capped) {
      const EntryBits<1, kMTiles> token_visible_entries = kTokens ? token_entries[threadIdx.x] : 0;
#pragma unroll
      for (int j = 0; j < kMTiles; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const AccumulatorIndex at = accumulator_index(0, j, e);  // row: key, column: query
          const Logit x = logit.template with_slope<decltype(capped)::value>(s[0][j][e]);
          float p = exp2_fast(x.log2_value - lse_log2[at.column]);
          if (!unmasked && !(kTokens ? entry_visible<kMTiles>(token_visible_entries, 0, j, e)
                                     : tile_mask.visible(at.column, at.row)))
            p = 0.f;
          s[0][j][e] = p;
          if (kKey) dp[0][j][e] = p * (dp[0][j][e] - row_delta[at.column]) * x.slope;
        }
      }
    };
    if (logit.capped()) {
      to_gradients(std::true_type{});
    } else {
      to_gradients(std::false_type{});
    }
    if (kValue) {
      uint32_t p_operand[1][kMTiles / 2][4];
      accumulator_to_operand<Element>(s, p_operand);
      mma_registers_by_columns<Element, 1, kDTiles, kMTiles / 2>(dv, p_operand, dout_tile, 0);
    }
    if (kKey) {
      uint32_t ds_operand[1][kMTiles / 2][4];
      accumulator_to_operand<Element>(dp, ds_operand);
      mma_registers_by_columns<Element, 1, kDTiles, kMTiles / 2>(dk, ds_operand, q_tile, 0);
    }
    step = next;
  }
  cp_async_wait<0>();

  const int lane = lane_index();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t key = key0 + warp_key + lane / 4 + 8 * h;
    if (key >= shape.seqlen_k) continue;
    const int64_t offset = ((batch * shape.seqlen_k + key) * shape.heads_kv + kv_head) * head_dim;
#pragma unroll
    for (int d = 0; d < kDTiles; ++d) {
      const int column = 8 * d + lane % 4 * 2;
      if (column >= head_dim) continue;
      if (kKey)
        *reinterpret_cast<uint32_t*>(static_cast<Element*>(params.dk) + offset + column) =
            pack_pair<Element>(dk[0][d][2 * h] * params.scale, dk[0][d][2 * h + 1] * params.scale);
      if (kValue)
        *reinterpret_cast<uint32_t*>(static_cast<Element*>(params.dv) + offset + column) =
            pack_pair<Element>(dv[0][d][2 * h], dv[0][d][2 * h + 1]);
    }
  }
}

template <typename Element, int kHeadDim, TileBudget kBudget>
struct QueryGradientLayout {
  using Config = QueryGradientConfig<kHeadDim, kBudget>;
  static constexpr int kThreads = Config::kWarps * 32;
  static constexpr int kBlockM = Config::kWarps * 16;
  static constexpr int kBlockN = Config::kBlockN;
  using QTile = SmemTile<Element, kBlockM, kHeadDim>;
  using KVTile = SmemTile<Element, kBlockN, kHeadDim>;
  // q, dout, then two buffers each of k and v.
  static constexpr int kSmemBytes = 2 * QTile::kBytes + 4 * KVTile::kBytes;
  static_assert(kBudget == TileBudget::kLarge || kSmemBytes <= kSm86BlockSharedBytes, "small tiles must fit 99 KB");
};

// The token variant asks for a minimum of one block per SM: left to itself, ptxas held it to 168 registers (three
// blocks) on sm80 and spilled; 0 leaves the dense kernel's allocation as it was.
template <typename Element, int kHeadDim, TileBudget kBudget, bool kTokens>
__global__ void __launch_bounds__(QueryGradientLayout<Element, kHeadDim, kBudget>::kThreads, kTokens ? 1 : 0)
    attention_backward_dq_kernel(const AttentionBackwardParams params, const float* delta) {
  using Layout = QueryGradientLayout<Element, kHeadDim, kBudget>;
  constexpr int kThreads = Layout::kThreads;
  constexpr int kBlockM = Layout::kBlockM;
  constexpr int kBlockN = Layout::kBlockN;
  constexpr int kDTiles = kHeadDim / 8;
  constexpr int kNTiles = kBlockN / 8;

  extern __shared__ __align__(16) unsigned char shared_bytes[];
  using QTile = typename Layout::QTile;
  using KVTile = typename Layout::KVTile;
  const QTile q_tile{reinterpret_cast<Element*>(shared_bytes)};
  const QTile dout_tile{q_tile.data + QTile::kElements};
  // Buffer b of k is k_tiles + b * KVTile::kElements, of v likewise.
  Element* const k_tiles = dout_tile.data + QTile::kElements;
  Element* const v_tiles = k_tiles + 2 * KVTile::kElements;

  const AttentionShape& shape = params.shape;
  const AttentionMask& mask = params.mask;
  const int head_dim = static_cast<int>(shape.head_dim);
  const QueryBlock work = query_block<kBlockM, kBlockN>(shape, mask);
  const int64_t batch = work.batch, head = work.head, row_begin = work.row_begin, rows = work.rows;
  // Given positions, the window applies to them, not to indices: the walk then starts from every key block.
  const bool window_on_positions = kTokens && params.tokens.q_positions;
  const int64_t n_begin = window_on_positions ? 0 : work.key_blocks_begin;
  const int64_t n_end = window_on_positions ? (shape.seqlen_k + kBlockN - 1) / kBlockN : work.key_blocks_end;
  const int64_t q_stride = shape.heads_q * head_dim;
  const int64_t kv_stride = shape.heads_kv * head_dim;
  const int64_t q_offset = work.q_offset;
  const Element* k = static_cast<const Element*>(params.k) + work.kv_offset;
  const Element* v = static_cast<const Element*>(params.v) + work.kv_offset;

  const auto stage = [&](int64_t n, int buffer) {
    const int64_t key0 = n * kBlockN;
    KVTile{k_tiles + buffer * KVTile::kElements}.template load_async<kThreads>(k + key0 * kv_stride, kv_stride,
                                                                               shape.seqlen_k - key0, head_dim);
    KVTile{v_tiles + buffer * KVTile::kElements}.template load_async<kThreads>(v + key0 * kv_stride, kv_stride,
                                                                               shape.seqlen_k - key0, head_dim);
  };
  q_tile.template load_async<kThreads>(static_cast<const Element*>(params.q) + q_offset, q_stride, rows, head_dim);
  TileWalk<> walk;
  const auto sides = [&] {
    return WalkSides{query_row(params.tokens, shape, batch), static_cast<int>(row_begin),
                     static_cast<int>(row_begin + rows), key_row(params.tokens, shape, batch), kBlockN, true};
  };
  const auto following = [&](int64_t after) {
    return kTokens ? walk.first_visible(after, n_end, sides(), mask) : after;
  };
  int64_t n = following(n_begin);
  dout_tile.template load_async<kThreads>(static_cast<const Element*>(params.dout) + q_offset, q_stride, rows,
                                          head_dim);
  if (n < n_end) stage(n, 0);
  cp_async_commit();

  const int warp_row = static_cast<int>(threadIdx.x) / 32 * 16;
  const int lane = lane_index();
  float lse_log2[2];
  float row_delta[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t row = row_begin + warp_row + lane / 4 + 8 * h;
    const bool valid = row < shape.seqlen_q;
    const int64_t stat = (batch * shape.heads_q + head) * shape.seqlen_q + row;
    lse_log2[h] = backward_lse_log2(valid, valid ? params.lse[stat] : 0.f);
    row_delta[h] = valid ? delta[stat] : 0.f;
  }
  const LogitTransform logit(params.scale, mask.softcap);
  float dq[1][kDTiles][4] = {};

  for (int buffer = 0; n < n_end; buffer ^= 1) {
    const int64_t key0 = n * kBlockN;
    // Taken before the search for the next block, which may move the walk's window past this one.
    const bool tokens_full = kTokens && walk.full(n);
    const int64_t next = following(n + 1);
    cp_async_wait<0>();
    __syncthreads();  // this block's k and v have landed, and every warp is done with the other buffer
    if (next < n_end) stage(next, buffer ^ 1);
    cp_async_commit();

    const KVTile k_tile{k_tiles + buffer * KVTile::kElements};
    const KVTile v_tile{v_tiles + buffer * KVTile::kElements};
    const auto token_visible_entries =
        kTokens && !tokens_full ? visible_entries<1, kNTiles, false>(query_row(params.tokens, shape, batch),
                                                                     row_begin + warp_row,
                                                                     key_row(params.tokens, shape, batch), key0, mask)
                                : EntryBits<1, kNTiles>{0};
    float s[1][kNTiles][4] = {};
    mma_rows_by_rows<Element, 1, kNTiles, kHeadDim / 16>(s, q_tile, warp_row, k_tile, 0);
    float dp[1][kNTiles][4] = {};
    mma_rows_by_rows<Element, 1, kNTiles, kHeadDim / 16>(dp, dout_tile, warp_row, v_tile, 0);

    const bool unmasked =
        kTokens ? tokens_full
                : key0 + kBlockN <= shape.seqlen_k &&
                      tile_inside_window(mask, row_begin, row_begin + kBlockM, key0, key0 + kBlockN);
    const auto to_gradients = [&](auto capped) {
#pragma unroll
      for (int j = 0; j < kNTiles; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const Logit x = logit.template with_slope<decltype(capped)::value>(s[0][j][e]);
          const float p = exp2_fast(x.log2_value - lse_log2[e / 2]);
          s[0][j][e] = p * (dp[0][j][e] - row_delta[e / 2]) * x.slope;
        }
      }
    };
    if (logit.capped()) {
      to_gradients(std::true_type{});
    } else {
      to_gradients(std::false_type{});
    }
    // Hidden entries' dS is 0 (their p is), selected rather than multiplied since a hidden logit may overflow p. A
    // pass of its own after the gradients: inside their loop (as the dk/dv kernel has it, where moving it out spills
    // at head dim 128) it took this kernel from 168 to 180 registers at head dim 64, one block per SM fewer.
    if (!unmasked) {
      const TileMask tile_mask(mask, shape.seqlen_k, row_begin + warp_row, key0);
#pragma unroll
      for (int j = 0; j < kNTiles; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const AccumulatorIndex at = accumulator_index(0, j, e);
          const bool visible = kTokens ? entry_visible<kNTiles>(token_visible_entries, 0, j, e)
                                       : tile_mask.visible(at.row, at.column);
          if (!visible) s[0][j][e] = 0.f;
        }
      }
    }
    uint32_t ds_operand[1][kNTiles / 2][4];
    accumulator_to_operand<Element>(s, ds_operand);
    mma_registers_by_columns<Element, 1, kDTiles, kNTiles / 2>(dq, ds_operand, k_tile, 0);
    n = next;
  }
  cp_async_wait<0>();

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t row = row_begin + warp_row + lane / 4 + 8 * h;
    if (row >= shape.seqlen_q) continue;
    Element* dq_row =
        static_cast<Element*>(params.dq) + ((batch * shape.seqlen_q + row) * shape.heads_q + head) * head_dim;
#pragma unroll
    for (int d = 0; d < kDTiles; ++d) {
      const int column = 8 * d + lane % 4 * 2;
      if (column < head_dim)
        *reinterpret_cast<uint32_t*>(dq_row + column) =
            pack_pair<Element>(dq[0][d][2 * h] * params.scale, dq[0][d][2 * h + 1] * params.scale);
    }
  }
}

template <typename Element, int kHeadDim, TileBudget kBudget, bool kTokens>
cudaError_t launch_backward_kernels(const AttentionBackwardParams& params, const float* delta, cudaStream_t stream) {
  using KeyLayout = KeyGradientLayout<Element, kHeadDim, kBudget>;
  using QueryLayout = QueryGradientLayout<Element, kHeadDim, kBudget>;
  const AttentionShape& shape = params.shape;
  cudaError_t status = cudaSuccess;
  const int64_t key_blocks =
      (shape.seqlen_k + KeyLayout::kBlockN - 1) / KeyLayout::kBlockN * shape.heads_kv * shape.batch;
  const auto key_pass = [&](auto kernel) {
    return launch_with_smem(kernel, key_blocks, KeyLayout::kThreads, KeyLayout::kSmemBytes, stream, params, delta);
  };
  if constexpr (KeyLayout::Config::kSplitPasses) {
    if (status == cudaSuccess)
      status = key_pass(attention_backward_dkdv_kernel<Element, kHeadDim, kBudget, KeyGradients::kValueOnly, kTokens>);
    if (status == cudaSuccess)
      status = key_pass(attention_backward_dkdv_kernel<Element, kHeadDim, kBudget, KeyGradients::kKeyOnly, kTokens>);
  } else {
    status = key_pass(attention_backward_dkdv_kernel<Element, kHeadDim, kBudget, KeyGradients::kBoth, kTokens>);
  }
  if (status != cudaSuccess) return status;
  return launch_with_smem(attention_backward_dq_kernel<Element, kHeadDim, kBudget, kTokens>,
                          query_blocks(shape, QueryLayout::kBlockM), QueryLayout::kThreads, QueryLayout::kSmemBytes,
                          stream, params, delta);
}

template <typename Element, int kHeadDim, TileBudget kBudget>
cudaError_t launch_backward_tiles(const AttentionBackwardParams& params, const float* delta, cudaStream_t stream) {
  return params.tokens.any() ? launch_backward_kernels<Element, kHeadDim, kBudget, true>(params, delta, stream)
                             : launch_backward_kernels<Element, kHeadDim, kBudget, false>(params, delta, stream);
}

template <typename Element, int kHeadDim>
cudaError_t launch_backward(const AttentionBackwardParams& params, void* workspace, cudaStream_t stream) {
  auto* delta = static_cast<float*>(workspace);
  // Stream order makes delta complete before the gradient kernels read it.
  const cudaError_t status = launch_backward_delta(params, delta, stream);
  if (status != cudaSuccess) return status;
  constexpr int kLargeBytes = std::max(KeyGradientLayout<Element, kHeadDim, TileBudget::kLarge>::kSmemBytes,
                                       QueryGradientLayout<Element, kHeadDim, TileBudget::kLarge>::kSmemBytes);
  return launch_with_tile_budget<kLargeBytes>([&](auto budget) {
    return launch_backward_tiles<Element, kHeadDim, decltype(budget)::value>(params, delta, stream);
  });
}

}  // namespace jax_flash::cuda_kernels::tensor_core
