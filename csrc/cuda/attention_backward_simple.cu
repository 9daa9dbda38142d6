// Simple attention backward, deterministic and free of atomics: every gradient row is summed by the one warp that
// owns it, in a fixed order. After the delta kernel of backward_delta.h, two kernels on one stream:
//   dk/dv:  a warp per key row j walks the query rows of its GQA group that see it;
//   dq:     a warp per query row i walks the keys it sees.
// Both gradient kernels recompute p_ij = exp(capped_ij - lse_i) and
// dlogit_ij = p_ij (dout_i . v_j - delta_i) * slope_ij, the gradient with respect to the logit before the softcap;
// then dv_j = sum_i p_ij dout_i, dk_j = scale * sum_i dlogit_ij q_i and dq_i = scale * sum_j dlogit_ij k_j.
// The per-token inputs (TokenMask) are tested per element with token_visible, as in the forward.
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "../attention_mask.h"
#include "attention_simple.h"
#include "backward_delta.h"
#include "dispatch.cuh"
#include "grid.cuh"
#include "warp_rows.cuh"

namespace jax_flash::cuda_kernels {
namespace {

// Offset of row `query` of (batch, head) in the [batch, heads_q, seqlen_q] lse and delta arrays.
__device__ __forceinline__ int64_t stat_index(const AttentionShape& shape, int64_t batch, int64_t head,
                                              int64_t query) {
  return (batch * shape.heads_q + head) * shape.seqlen_q + query;
}

// What one (query i, key j) pair contributes, from the raw q_i.k_j and dout_i.v_j: p_ij, and dlogit_ij, the gradient
// with respect to scale * q_i.k_j (the logit before the softcap). Both are 0 where the key is masked and for rows
// that saw no key in the forward (lse = -inf).
struct ScoreGradient {
  float prob;
  float dlogit;
};

// dout_v and row_delta come summed in double, in the same order: their difference cancels most of their digits
// where a few keys carry the row, and is exactly 0 where one key does (out_i = v_j).
__device__ __forceinline__ ScoreGradient score_gradient(const AttentionBackwardParams& params, bool visible,
                                                        float row_lse, double row_delta, float qk, double dout_v) {
  if (!visible || row_lse == -INFINITY) return {0.f, 0.f};
  const float capped = capped_logit(params.scale * qk, params.mask.softcap);
  const float prob = expf(capped - row_lse);
  return {prob, prob * static_cast<float>(dout_v - row_delta) * capped_logit_slope(capped, params.mask.softcap)};
}

template <typename Element, int kMaxHeadDim>
__global__ void __launch_bounds__(kThreadsPerBlock, 1)
    attention_backward_dkdv_kernel(AttentionBackwardParams params, const double* delta) {
  constexpr int kDims = kDimsPerLane<kMaxHeadDim>;
  constexpr int kTile = kTileRows<kMaxHeadDim>;
  __shared__ __align__(16) float q_tile[kTile * kMaxHeadDim];
  __shared__ __align__(16) float dout_tile[kTile * kMaxHeadDim];

  const AttentionShape& shape = params.shape;
  const AttentionMask& mask = params.mask;
  const int head_dim = static_cast<int>(shape.head_dim);
  const SeqLayout q_layout{shape.seqlen_q, shape.heads_q, shape.head_dim};
  const SeqLayout kv_layout{shape.seqlen_k, shape.heads_kv, shape.head_dim};
  const auto* q = static_cast<const Element*>(params.q);
  const auto* dout = static_cast<const Element*>(params.dout);

  const BlockRows block = block_rows(shape.heads_kv, shape.seqlen_k);
  const int64_t key = block.row_begin + warp_id();
  const bool owns_key = key < block.row_end;
  const int lane = lane_id();

  float k[kDims] = {};
  float v[kDims] = {};
  if (owns_key) {
    const int64_t offset = kv_layout.row(block.batch, key, block.head);
    load_lane_row(static_cast<const Element*>(params.k) + offset, head_dim, k);
    load_lane_row(static_cast<const Element*>(params.v) + offset, head_dim, v);
  }
  float dk[kDims] = {};
  float dv[kDims] = {};

  const int64_t group = shape.heads_q / shape.heads_kv;
  // Given positions, the window applies to them, not to indices, so every query is a candidate.
  const bool window_on_positions = params.tokens.q_positions != nullptr;
  const int64_t query_begin = window_on_positions ? 0 : first_row_seeing(mask, block.row_begin);
  const int64_t query_end = window_on_positions ? shape.seqlen_q : end_row_seeing(mask, block.row_end, shape.seqlen_q);
  for (int64_t head = block.head * group; head < (block.head + 1) * group; ++head) {
    for (int64_t tile_begin = query_begin; tile_begin < query_end; tile_begin += kTile) {
      __syncthreads();  // every warp is done with the previous tile
      stage_tile<kTile>(q_tile, q, q_layout, block.batch, head, tile_begin, query_end);
      stage_tile<kTile>(dout_tile, dout, q_layout, block.batch, head, tile_begin, query_end);
      __syncthreads();
      if (!owns_key) continue;

      // Lane t handles query tile_begin + t.
      const float qk = dot_with_tile_rows<kTile>(k, q_tile, head_dim);
      const double dout_v = dot_with_tile_rows<kTile, double>(v, dout_tile, head_dim);
      const int64_t query = tile_begin + lane;
      const bool visible =
          lane < kTile && query < query_end && token_visible(mask, params.tokens, shape, block.batch, query, key);
      float row_lse = -INFINITY;
      double row_delta = 0.0;
      if (visible) {
        const int64_t stat = stat_index(shape, block.batch, head, query);
        row_lse = params.lse[stat];
        row_delta = delta[stat];
      }
      const ScoreGradient grad = score_gradient(params, visible, row_lse, row_delta, qk, dout_v);

      accumulate_tile_rows<kTile>(dv, grad.prob, dout_tile, head_dim);
      accumulate_tile_rows<kTile>(dk, grad.dlogit, q_tile, head_dim);
    }
  }
  if (!owns_key) return;

  const int64_t offset = kv_layout.row(block.batch, key, block.head);
  store_lane_row(static_cast<Element*>(params.dk) + offset, head_dim, dk, params.scale);
  store_lane_row(static_cast<Element*>(params.dv) + offset, head_dim, dv, 1.f);
}

template <typename Element, int kMaxHeadDim>
__global__ void __launch_bounds__(kThreadsPerBlock, 1)
    attention_backward_dq_kernel(AttentionBackwardParams params, const double* delta) {
  constexpr int kDims = kDimsPerLane<kMaxHeadDim>;
  constexpr int kTile = kTileRows<kMaxHeadDim>;
  __shared__ __align__(16) float k_tile[kTile * kMaxHeadDim];
  __shared__ __align__(16) float v_tile[kTile * kMaxHeadDim];

  const AttentionShape& shape = params.shape;
  const AttentionMask& mask = params.mask;
  const int head_dim = static_cast<int>(shape.head_dim);
  const SeqLayout q_layout{shape.seqlen_q, shape.heads_q, shape.head_dim};
  const SeqLayout kv_layout{shape.seqlen_k, shape.heads_kv, shape.head_dim};
  const auto* k = static_cast<const Element*>(params.k);
  const auto* v = static_cast<const Element*>(params.v);

  const BlockRows block = block_rows(shape.heads_q, shape.seqlen_q);
  const int64_t kv_head = block.head / (shape.heads_q / shape.heads_kv);
  const int64_t query = block.row_begin + warp_id();
  const bool owns_query = query < block.row_end;
  const int lane = lane_id();

  float q[kDims] = {};
  float dout[kDims] = {};
  float row_lse = -INFINITY;
  double row_delta = 0.0;
  if (owns_query) {
    const int64_t offset = q_layout.row(block.batch, query, block.head);
    load_lane_row(static_cast<const Element*>(params.q) + offset, head_dim, q);
    load_lane_row(static_cast<const Element*>(params.dout) + offset, head_dim, dout);
    const int64_t stat = stat_index(shape, block.batch, block.head, query);
    row_lse = params.lse[stat];
    row_delta = delta[stat];
  }
  float dq[kDims] = {};

  const bool window_on_positions = params.tokens.q_positions != nullptr;
  const int64_t key_begin = window_on_positions ? 0 : first_visible_key(mask, block.row_begin);
  const int64_t key_end = window_on_positions ? shape.seqlen_k : end_visible_key(mask, block.row_end, shape.seqlen_k);
  for (int64_t tile_begin = key_begin; tile_begin < key_end; tile_begin += kTile) {
    __syncthreads();  // every warp is done with the previous tile
    stage_tile<kTile>(k_tile, k, kv_layout, block.batch, kv_head, tile_begin, key_end);
    stage_tile<kTile>(v_tile, v, kv_layout, block.batch, kv_head, tile_begin, key_end);
    __syncthreads();
    // Rows that saw no key in the forward (lse = -inf) have no gradient.
    if (!owns_query || row_lse == -INFINITY) continue;

    // Lane t handles key tile_begin + t.
    const float qk = dot_with_tile_rows<kTile>(q, k_tile, head_dim);
    const double dout_v = dot_with_tile_rows<kTile, double>(dout, v_tile, head_dim);
    const int64_t key = tile_begin + lane;
    const bool visible =
        lane < kTile && key < key_end && token_visible(mask, params.tokens, shape, block.batch, query, key);
    const ScoreGradient grad = score_gradient(params, visible, row_lse, row_delta, qk, dout_v);

    accumulate_tile_rows<kTile>(dq, grad.dlogit, k_tile, head_dim);
  }
  if (!owns_query) return;

  store_lane_row(static_cast<Element*>(params.dq) + q_layout.row(block.batch, query, block.head), head_dim, dq,
                 params.scale);
}

}  // namespace

cudaError_t attention_backward_simple(const AttentionBackwardParams& params, void* workspace, cudaStream_t stream) {
  const AttentionShape& shape = params.shape;
  auto* delta = static_cast<double*>(workspace);
  // Stream order makes delta complete before the gradient kernels read it.
  if (const cudaError_t error = launch_backward_delta(params, delta, stream); error != cudaSuccess) return error;
  const int64_t dkdv_blocks = shape.batch * shape.heads_kv * blocks_covering(shape.seqlen_k);
  const int64_t dq_blocks = shape.batch * shape.heads_q * blocks_covering(shape.seqlen_q);
  return dispatch_element_and_head_dim(params.dtype, shape.head_dim, [&](auto element, auto bucket) {
    using Element = typename decltype(element)::type;
    constexpr int kMaxHeadDim = decltype(bucket)::value;
    cudaError_t error = launch_blocks(attention_backward_dkdv_kernel<Element, kMaxHeadDim>, dkdv_blocks, stream, params, delta);
    if (error != cudaSuccess) return error;
    return launch_blocks(attention_backward_dq_kernel<Element, kMaxHeadDim>, dq_blocks, stream, params, delta);
  });
}

}  // namespace jax_flash::cuda_kernels
