// delta_i = dout_i . out_i for every query row, with a warp per row of dout / out, summed in float or double.
#include "backward_delta.h"

#include <cstddef>
#include <cstdint>

#include "dispatch.cuh"
#include "grid.cuh"
#include "warp_rows.cuh"

namespace jax_flash::cuda_kernels {
namespace {

template <typename Element, int kMaxHeadDim, typename Accum>
__global__ void __launch_bounds__(kThreadsPerBlock, 1)
    attention_backward_delta_kernel(AttentionBackwardParams params, Accum* delta) {
  constexpr int kDims = kDimsPerLane<kMaxHeadDim>;
  const AttentionShape& shape = params.shape;
  const int head_dim = static_cast<int>(shape.head_dim);

  // A warp per row of dout / out, taken in their [batch, seq, heads] memory order.
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp_id();
  if (row >= shape.batch * shape.seqlen_q * shape.heads_q) return;
  float dout[kDims];
  float out[kDims];
  load_lane_row(static_cast<const Element*>(params.dout) + row * head_dim, head_dim, dout);
  load_lane_row(static_cast<const Element*>(params.out) + row * head_dim, head_dim, out);
  // lane_dot's order (slots in turn, then the warp's shuffle tree), which the simple kernels' dout . v follow too.
  Accum partial = 0;
#pragma unroll
  for (int slot = 0; slot < kDims; ++slot) partial += Accum(dout[slot]) * Accum(out[slot]);
  const Accum row_delta = warp_sum(partial);

  const int64_t head = row % shape.heads_q;
  const int64_t query = row / shape.heads_q % shape.seqlen_q;
  const int64_t batch = row / (shape.heads_q * shape.seqlen_q);
  if (lane_id() == 0) delta[(batch * shape.heads_q + head) * shape.seqlen_q + query] = row_delta;
}

template <typename Accum>
cudaError_t launch(const AttentionBackwardParams& params, Accum* delta, cudaStream_t stream) {
  const AttentionShape& shape = params.shape;
  const int64_t blocks = blocks_covering(shape.batch * shape.seqlen_q * shape.heads_q);
  return dispatch_element_and_head_dim(params.dtype, shape.head_dim, [&](auto element, auto bucket) {
    using Element = typename decltype(element)::type;
    return launch_blocks(attention_backward_delta_kernel<Element, decltype(bucket)::value, Accum>, blocks, stream,
                         params, delta);
  });
}

}  // namespace

size_t backward_delta_bytes(const AttentionShape& shape) {
  return sizeof(double) * static_cast<size_t>(shape.batch * shape.heads_q * shape.seqlen_q);
}

cudaError_t launch_backward_delta(const AttentionBackwardParams& params, float* delta, cudaStream_t stream) {
  return launch(params, delta, stream);
}

cudaError_t launch_backward_delta(const AttentionBackwardParams& params, double* delta, cudaStream_t stream) {
  return launch(params, delta, stream);
}

}  // namespace jax_flash::cuda_kernels
