// The softmax-backward term every backward shares: delta_i = dout_i . out_i, for every (batch, head, query row),
// written as [batch, heads_q, seqlen_q] into a buffer the caller provides (the backward workspace): in float32 for
// the tensor-core kernels, in double for the simple kernels, which subtract it from a dout . v summed in double in
// the same order (dP - delta cancels most digits where a few keys carry a row).
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

#include "../attention_params.h"

namespace jax_flash::cuda_kernels {

// Enough for either width.
size_t backward_delta_bytes(const AttentionShape& shape);

cudaError_t launch_backward_delta(const AttentionBackwardParams& params, float* delta, cudaStream_t stream);
cudaError_t launch_backward_delta(const AttentionBackwardParams& params, double* delta, cudaStream_t stream);

}  // namespace jax_flash::cuda_kernels
