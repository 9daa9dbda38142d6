// The softmax-backward term every backward shares: delta_i = dout_i . out_i, for every (batch, head, query row),
// written as float32 [batch, heads_q, seqlen_q] into a buffer the caller provides (the backward workspace).
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

#include "../attention_params.h"

namespace jax_flash::cuda_kernels {

size_t backward_delta_bytes(const AttentionShape& shape);

cudaError_t launch_backward_delta(const AttentionBackwardParams& params, float* delta, cudaStream_t stream);

}  // namespace jax_flash::cuda_kernels
