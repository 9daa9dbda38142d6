// Entry points of the tensor-core kernels (fp16 and bf16, sm80 and later). Their dispatch is generated
// (generate_instantiations.py): a call runs on the smallest compiled head-dim bucket that holds its head_dim, and a
// dtype or head_dim this build has no kernel for returns cudaErrorNotSupported.
#pragma once

#include <cuda_runtime.h>

#include "../../attention_params.h"

namespace jax_flash::cuda_kernels::tensor_core {

cudaError_t forward(const AttentionForwardParams& params, cudaStream_t stream);

// `workspace` holds backward_delta_bytes(shape) (backward_delta.h).
cudaError_t backward(const AttentionBackwardParams& params, void* workspace, cudaStream_t stream);

template <typename Element, int kHeadDim>
cudaError_t launch_forward(const AttentionForwardParams& params, cudaStream_t stream);

template <typename Element, int kHeadDim>
cudaError_t launch_backward(const AttentionBackwardParams& params, void* workspace, cudaStream_t stream);

}  // namespace jax_flash::cuda_kernels::tensor_core
