// The tensor-core forward (FlashAttention-2 style): a block owns kBlockM query rows of one (batch, head), each warp
// 16 * kMTiles of them, and streams the visible key blocks through shared memory, keeping the running softmax max,
// sum and output in registers.
//
// Per key block: s = q k^T on tensor cores; logits (scale, softcap, mask) and the online-softmax update in
// registers; o += p v with p fed straight from the s accumulator. k and v are double-buffered: the next block's
// copies are in flight during the whole of this block's math, and one barrier per block suffices.
//
// Under a TokenMask (lengths, segment ids, positions) the key blocks are walked with token_tiles.cuh: empty ones are
// never loaded, full ones run unmasked, partial ones are masked element by element. That path is its own
// instantiation (kTokens), picked per call: as a runtime branch it cost the dense kernel registers (and spills at
// head dim 64), where this way the kernel without a TokenMask is the same code as before.
#pragma once

#include <cmath>
#include <cstdint>

#include <cuda_runtime.h>

#include "../../attention_mask.h"
#include "../../attention_params.h"
#include "logits.cuh"
#include "query_block.cuh"
#include "generated/tile_configs.h"
#include "launch_with_smem.cuh"
#include "smem_tile.cuh"
#include "../tile_mask.cuh"
#include "token_tiles.cuh"
#include "warp_mma.cuh"

namespace jax_flash::cuda_kernels::tensor_core {

template <typename Element, int kHeadDim, TileBudget kBudget>
struct ForwardLayout {
  using Config = ForwardConfig<kHeadDim, kBudget>;
  static constexpr int kThreads = Config::kWarps * 32;
  static constexpr int kMTiles = Config::kMTiles;
  static constexpr int kWarpRows = 16 * kMTiles;
  static constexpr int kBlockM = Config::kWarps * kWarpRows;
  static constexpr int kBlockN = Config::kBlockN;
  using QTile = SmemTile<Element, kBlockM, kHeadDim>;
  using KVTile = SmemTile<Element, kBlockN, kHeadDim>;
  // q, then two buffers each of k and v.
  static constexpr int kSmemBytes = QTile::kBytes + 4 * KVTile::kBytes;
  static_assert(kBudget == TileBudget::kLarge || kSmemBytes <= kSm86BlockSharedBytes, "small tiles must fit 99 KB");
};

template <typename Element, int kHeadDim, TileBudget kBudget, bool kTokens>
__global__ void __launch_bounds__(ForwardLayout<Element, kHeadDim, kBudget>::kThreads)
    attention_forward_kernel(const AttentionForwardParams params) {
  using Layout = ForwardLayout<Element, kHeadDim, kBudget>;
  constexpr int kThreads = Layout::kThreads;
  constexpr int kMTiles = Layout::kMTiles;
  constexpr int kBlockM = Layout::kBlockM;
  constexpr int kBlockN = Layout::kBlockN;
  constexpr int kDTiles = kHeadDim / 8;
  constexpr int kNTiles = kBlockN / 8;

  extern __shared__ __align__(16) unsigned char shared_bytes[];
  using KVTile = typename Layout::KVTile;
  const typename Layout::QTile q_tile{reinterpret_cast<Element*>(shared_bytes)};
  // Buffer b of k is k_tiles + b * KVTile::kElements, of v likewise.
  Element* const k_tiles = q_tile.data + Layout::QTile::kElements;
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
  const Element* q = static_cast<const Element*>(params.q) + work.q_offset;
  const Element* k = static_cast<const Element*>(params.k) + work.kv_offset;
  const Element* v = static_cast<const Element*>(params.v) + work.kv_offset;

  const auto stage = [&](int64_t n, int buffer) {
    const int64_t key0 = n * kBlockN;
    KVTile{k_tiles + buffer * KVTile::kElements}.template load_async<kThreads>(k + key0 * kv_stride, kv_stride,
                                                                               shape.seqlen_k - key0, head_dim);
    KVTile{v_tiles + buffer * KVTile::kElements}.template load_async<kThreads>(v + key0 * kv_stride, kv_stride,
                                                                               shape.seqlen_k - key0, head_dim);
  };
  TileWalk<> walk;
  // Built only when the walk classifies new key blocks; see WalkSides.
  const auto sides = [&] {
    return WalkSides{query_row(params.tokens, shape, batch), static_cast<int>(row_begin),
                     static_cast<int>(row_begin + rows), key_row(params.tokens, shape, batch), kBlockN, true};
  };
  const auto following = [&](int64_t after) {
    return kTokens ? walk.first_visible(after, n_end, sides(), mask) : after;
  };
  int64_t n = following(n_begin);
  q_tile.template load_async<kThreads>(q, q_stride, rows, head_dim);
  if (n < n_end) stage(n, 0);
  cp_async_commit();

  const int warp_row = static_cast<int>(threadIdx.x) / 32 * Layout::kWarpRows;
  const LogitTransform logit(params.scale, mask.softcap);
  float o[kMTiles][kDTiles][4] = {};
  float row_max[kMTiles][2];
  float row_sum[kMTiles][2];  // this lane's share; the quad's lanes are summed once at the end
#pragma unroll
  for (int m = 0; m < kMTiles; ++m) row_max[m][0] = row_max[m][1] = -INFINITY, row_sum[m][0] = row_sum[m][1] = 0.f;

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
        kTokens && !tokens_full ? visible_entries<kMTiles, kNTiles, false>(query_row(params.tokens, shape, batch),
                                                                           row_begin + warp_row,
                                                                           key_row(params.tokens, shape, batch), key0,
                                                                           mask)
                                : EntryBits<kMTiles, kNTiles>{0};
    float s[kMTiles][kNTiles][4] = {};
    mma_rows_by_rows<Element, kMTiles, kNTiles, kHeadDim / 16>(s, q_tile, warp_row, k_tile, 0);

    const bool unmasked =
        kTokens ? tokens_full
                : key0 + kBlockN <= shape.seqlen_k &&
                      tile_inside_window(mask, row_begin, row_begin + kBlockM, key0, key0 + kBlockN);
    logit.apply(s);
    if (!unmasked) {
      // int32 compares of warp-relative coordinates (tile_mask.cuh), not the 64-bit rule per element: the
      // masked path's index arithmetic set the kernel's register count.
      const TileMask tile_mask(mask, shape.seqlen_k, row_begin + warp_row, key0);
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
        for (int j = 0; j < kNTiles; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const AccumulatorIndex at = accumulator_index(m, j, e);
            const bool visible = kTokens ? entry_visible<kNTiles>(token_visible_entries, m, j, e)
                                         : tile_mask.visible(at.row, at.column);
            if (!visible) s[m][j][e] = -INFINITY;
          }
        }
      }
    }
#pragma unroll
    for (int m = 0; m < kMTiles; ++m) {
      // Online softmax, per row half h (lane rows l/4 and l/4 + 8).
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float block_max = row_max[m][h];
#pragma unroll
        for (int j = 0; j < kNTiles; ++j) block_max = fmaxf(block_max, fmaxf(s[m][j][2 * h], s[m][j][2 * h + 1]));
        block_max = row_max_of_quad(block_max);
        // Until a row has seen a visible key its max is -inf; shifting by 0 then keeps every exp2 at exp2(-inf) = 0
        // instead of NaN.
        const float shift = block_max == -INFINITY ? 0.f : block_max;
        const float rescale = exp2_fast(row_max[m][h] - shift);
        row_max[m][h] = block_max;
        row_sum[m][h] *= rescale;
#pragma unroll
        for (int d = 0; d < kDTiles; ++d) o[m][d][2 * h] *= rescale, o[m][d][2 * h + 1] *= rescale;
#pragma unroll
        for (int j = 0; j < kNTiles; ++j) {
          s[m][j][2 * h] = exp2_fast(s[m][j][2 * h] - shift);
          s[m][j][2 * h + 1] = exp2_fast(s[m][j][2 * h + 1] - shift);
          row_sum[m][h] += s[m][j][2 * h] + s[m][j][2 * h + 1];
        }
      }
    }

    uint32_t p[kMTiles][kNTiles / 2][4];
    accumulator_to_operand<Element>(s, p);
    mma_registers_by_columns<Element, kMTiles, kDTiles, kNTiles / 2>(o, p, v_tile, 0);
    n = next;
  }
  cp_async_wait<0>();

  auto* out = static_cast<Element*>(params.out);
  const int lane = lane_index();
#pragma unroll
  for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float sum = row_sum_of_quad(row_sum[m][h]);
      const int64_t row = row_begin + warp_row + 16 * m + lane / 4 + 8 * h;
      if (row >= shape.seqlen_q) continue;
      // A row that saw no key has sum 0: its output is 0 and its lse -inf.
      const float inverse = sum > 0.f ? 1.f / sum : 0.f;
      Element* out_row = out + ((batch * shape.seqlen_q + row) * shape.heads_q + head) * head_dim;
#pragma unroll
      for (int d = 0; d < kDTiles; ++d) {
        const int column = 8 * d + lane % 4 * 2;
        if (column < head_dim)
          *reinterpret_cast<uint32_t*>(out_row + column) =
              pack_pair<Element>(o[m][d][2 * h] * inverse, o[m][d][2 * h + 1] * inverse);
      }
      if (lane % 4 == 0)
        params.lse[(batch * shape.heads_q + head) * shape.seqlen_q + row] =
            sum > 0.f ? (row_max[m][h] + log2f(sum)) * kLn2 : -INFINITY;
    }
  }
}

template <typename Element, int kHeadDim, TileBudget kBudget>
cudaError_t launch_forward_tiles(const AttentionForwardParams& params, cudaStream_t stream) {
  using Layout = ForwardLayout<Element, kHeadDim, kBudget>;
  const AttentionShape& shape = params.shape;
  const auto launch = [&](auto kernel) {
    return launch_with_smem(kernel, query_blocks(shape, Layout::kBlockM), Layout::kThreads, Layout::kSmemBytes,
                            stream, params);
  };
  return params.tokens.any() ? launch(attention_forward_kernel<Element, kHeadDim, kBudget, true>)
                             : launch(attention_forward_kernel<Element, kHeadDim, kBudget, false>);
}

template <typename Element, int kHeadDim>
cudaError_t launch_forward(const AttentionForwardParams& params, cudaStream_t stream) {
  return launch_with_tile_budget<ForwardLayout<Element, kHeadDim, TileBudget::kLarge>::kSmemBytes>([&](auto budget) {
    return launch_forward_tiles<Element, kHeadDim, decltype(budget)::value>(params, stream);
  });
}

}  // namespace jax_flash::cuda_kernels::tensor_core
