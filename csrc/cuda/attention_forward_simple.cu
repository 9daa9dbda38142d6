// Simple attention forward: a warp per query row, online softmax over tiles of keys staged in shared memory. The
// per-token inputs (TokenMask) are tested per element with token_visible; these float32 kernels skip no tiles for them.
#include <cmath>
#include <cstdint>

#include "../attention_mask.h"
#include "attention_simple.h"
#include "dispatch.cuh"
#include "grid.cuh"
#include "warp_rows.cuh"

namespace jax_flash::cuda_kernels {
namespace {

template <typename Element, int kMaxHeadDim>
__global__ void __launch_bounds__(kThreadsPerBlock, 1) attention_forward_simple_kernel(AttentionForwardParams params) {
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
  if (owns_query) load_lane_row(static_cast<const Element*>(params.q) + q_layout.row(block.batch, query, block.head),
                                head_dim, q);

  // Online softmax state of the row: the largest logit so far, the sum of exp(logit - running_max) and the output
  // weighted the same way, normalized only at the end.
  float running_max = -INFINITY;
  float running_sum = 0.f;
  float acc[kDims] = {};

  // Given positions, the window applies to them, not to indices, so every key is a candidate.
  const bool window_on_positions = params.tokens.q_positions != nullptr;
  const int64_t key_begin = window_on_positions ? 0 : first_visible_key(mask, block.row_begin);
  const int64_t key_end = window_on_positions ? shape.seqlen_k : end_visible_key(mask, block.row_end, shape.seqlen_k);
  for (int64_t tile_begin = key_begin; tile_begin < key_end; tile_begin += kTile) {
    __syncthreads();  // every warp is done with the previous tile
    stage_tile<kTile>(k_tile, k, kv_layout, block.batch, kv_head, tile_begin, key_end);
    stage_tile<kTile>(v_tile, v, kv_layout, block.batch, kv_head, tile_begin, key_end);
    __syncthreads();
    if (!owns_query) continue;

    // Lane t scores key tile_begin + t.
    const float dot = dot_with_tile_rows<kTile>(q, k_tile, head_dim);
    const int64_t key = tile_begin + lane;
    const bool visible =
        lane < kTile && key < key_end && token_visible(mask, params.tokens, shape, block.batch, query, key);
    const float logit = visible ? capped_logit(params.scale * dot, mask.softcap) : -INFINITY;

    const float new_max = fmaxf(running_max, warp_max(logit));
    // While the row has seen no visible key its max is -inf; shifting by 0 instead keeps exp(-inf - -inf) from
    // turning into NaN (every exp below is then exp(-inf) = 0).
    const float shift = new_max == -INFINITY ? 0.f : new_max;
    const float prob = expf(logit - shift);
    const float rescale = expf(running_max - shift);
    running_sum = running_sum * rescale + warp_sum(prob);
#pragma unroll
    for (int slot = 0; slot < kDims; ++slot) acc[slot] *= rescale;
    accumulate_tile_rows<kTile>(acc, prob, v_tile, head_dim);
    running_max = new_max;
  }
  if (!owns_query) return;

  // A row that saw no key has running_sum 0: its output is 0 and its lse -inf.
  const bool saw_key = running_sum > 0.f;
  store_lane_row(static_cast<Element*>(params.out) + q_layout.row(block.batch, query, block.head), head_dim, acc,
                 saw_key ? 1.f / running_sum : 0.f);
  if (lane == 0) {
    params.lse[(block.batch * shape.heads_q + block.head) * shape.seqlen_q + query] =
        saw_key ? running_max + logf(running_sum) : -INFINITY;
  }
}

}  // namespace

cudaError_t attention_forward_simple(const AttentionForwardParams& params, cudaStream_t stream) {
  const AttentionShape& shape = params.shape;
  const int64_t blocks = shape.batch * shape.heads_q * blocks_covering(shape.seqlen_q);
  return dispatch_element_and_head_dim(params.dtype, shape.head_dim, [&](auto element, auto bucket) {
    using Element = typename decltype(element)::type;
    return launch_blocks(attention_forward_simple_kernel<Element, decltype(bucket)::value>, blocks, stream, params);
  });
}

}  // namespace jax_flash::cuda_kernels
