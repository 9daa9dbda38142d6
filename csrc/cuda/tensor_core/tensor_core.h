// Entry points of the tensor-core kernels (fp16 and bf16, sm80 and later). Their dispatch is generated
// (generate_instantiations.py): a call runs on the smallest compiled head-dim bucket that holds its head_dim, and a
// dtype or head_dim this build has no kernel for returns cudaErrorNotSupported.
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

#include "../../attention_params.h"
#include "../backward_delta.h"

namespace jax_flash::cuda_kernels::tensor_core {

cudaError_t forward(const AttentionForwardParams& params, cudaStream_t stream);

// Whether a call's backward sums dQ inside the dk/dv kernel (query_gradient_sum.cuh): calls without a token mask
// that do not ask for determinism, at head dims whose dk/dv kernel runs one pass (up to 128; a tile table that
// cannot fuse runs the two kernels).
inline bool fuses_query_gradient(const AttentionShape& shape, bool deterministic, bool tokens) {
  return !deterministic && !tokens && shape.head_dim <= 128;
}

inline size_t query_gradient_sum_offset(const AttentionShape& shape) {
  return (backward_delta_bytes(shape) + 255) / 256 * 256;
}

inline size_t query_gradient_sum_bytes(const AttentionShape& shape) {
  return sizeof(float) * static_cast<size_t>(shape.batch * shape.seqlen_q * shape.heads_q * shape.head_dim);
}

// What backward() needs in `workspace`: delta (backward_delta.h), then the float32 dQ sum where the call fuses.
inline size_t backward_workspace_bytes(const AttentionShape& shape, bool deterministic, bool tokens) {
  return fuses_query_gradient(shape, deterministic, tokens)
             ? query_gradient_sum_offset(shape) + query_gradient_sum_bytes(shape)
             : backward_delta_bytes(shape);
}

cudaError_t backward(const AttentionBackwardParams& params, void* workspace, cudaStream_t stream);

template <typename Element, int kHeadDim>
cudaError_t launch_forward(const AttentionForwardParams& params, cudaStream_t stream);

template <typename Element, int kHeadDim>
cudaError_t launch_backward(const AttentionBackwardParams& params, void* workspace, cudaStream_t stream);

}  // namespace jax_flash::cuda_kernels::tensor_core
