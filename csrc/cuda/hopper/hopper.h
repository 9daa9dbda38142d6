// Entry point of the Hopper (sm_90a) kernels: wgmma, TMA and warp specialization. Built only when the build
// targets sm_90a (JAX_FLASH_WITH_HOPPER); the generated dispatch (generate_instantiations.py) answers
// cudaErrorNotSupported for a dtype or head_dim this build has no Hopper kernel for, and the caller then falls
// back to the sm80 tensor-core kernels.
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

#include "../../attention_params.h"

namespace jax_flash::cuda_kernels::hopper {

// Whether the current device runs sm_90a code (compute capability 9.0 exactly: sm_90a is not forward compatible).
bool device_supported();

// What forward() needs in `workspace`: the persistent kernel's work counter (work_tiles.cuh).
size_t forward_workspace_bytes();

cudaError_t forward(const AttentionForwardParams& params, void* workspace, cudaStream_t stream);

// What backward() needs in `workspace`: the padded per-row lse and delta (backward_rows.cuh), and unless the call
// is deterministic the float32 dQ sum of the fused backward (query_gradient_sum.cuh).
size_t backward_workspace_bytes(const AttentionShape& shape, bool deterministic);

cudaError_t backward(const AttentionBackwardParams& params, void* workspace, cudaStream_t stream);

template <typename Element, int kHeadDim>
cudaError_t launch_forward(const AttentionForwardParams& params, void* workspace, cudaStream_t stream);

template <typename Element, int kHeadDim>
cudaError_t launch_backward(const AttentionBackwardParams& params, void* workspace, cudaStream_t stream);

}  // namespace jax_flash::cuda_kernels::hopper
