// The simple CUDA attention kernels: a warp per query or key row, float32 math on CUDA cores, rows of the other
// operands staged through shared memory. They take any supported shape; launch.cu validates a call before it gets
// here, so these assume head_dim is a multiple of 8 in [8, 256], heads_q is a multiple of heads_kv > 0, and every
// tensor pointer is 16-byte aligned.
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

#include "../attention_params.h"

namespace jax_flash::cuda_kernels {

cudaError_t attention_forward_simple(const AttentionForwardParams& params, cudaStream_t stream);

// `workspace` holds backward_delta_bytes(shape) (backward_delta.h).
cudaError_t attention_backward_simple(const AttentionBackwardParams& params, void* workspace, cudaStream_t stream);

}  // namespace jax_flash::cuda_kernels
