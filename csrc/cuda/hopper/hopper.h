// Entry point of the Hopper (sm_90a) kernels: wgmma, TMA and warp specialization. Built only when the build
// targets sm_90a (JAX_FLASH_WITH_HOPPER); the generated dispatch (generate_instantiations.py) answers
// cudaErrorNotSupported for a dtype or head_dim this build has no Hopper kernel for, and the caller then falls
// back to the sm80 tensor-core kernels.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "../../attention_params.h"

namespace jax_flash::cuda_kernels::hopper {

// Whether the current device runs sm_90a code (compute capability 9.0 exactly: sm_90a is not forward compatible).
bool device_supported();

// What forward() needs in `workspace`: the persistent kernel's work counter (work_tiles.cuh).
size_t forward_workspace_bytes();

cudaError_t forward(const AttentionForwardParams& params, void* workspace, cudaStream_t stream);

// The FP8 forward (e4m3 q, k, v with params.descale; bfloat16 output), head dims that are multiples of 16 up to 128
// (all run in the 128 bucket, zero-padded).
// Its workspace holds the work counter and, from kFp8ValueOffset on, v transposed (fp8_value_transpose.cuh).
constexpr size_t kFp8ValueOffset = 256;
inline int64_t fp8_padded_keys(int64_t seqlen_k) { return (seqlen_k + 31) / 32 * 32; }
bool forward_fp8_supported(const AttentionShape& shape);
size_t forward_fp8_workspace_bytes(const AttentionShape& shape);
cudaError_t forward_fp8(const AttentionForwardParams& params, void* workspace, cudaStream_t stream);

// What backward() needs in `workspace`: the padded per-row lse and delta (backward_rows.cuh), and unless the call
// is deterministic the float32 dQ sum of the fused backward (query_gradient_sum.cuh).
size_t backward_workspace_bytes(const AttentionShape& shape, bool deterministic);

cudaError_t backward(const AttentionBackwardParams& params, void* workspace, cudaStream_t stream);

template <typename Element, int kHeadDim>
cudaError_t launch_forward(const AttentionForwardParams& params, void* workspace, cudaStream_t stream);

template <int kHeadDim>
cudaError_t launch_forward_fp8(const AttentionForwardParams& params, void* workspace, cudaStream_t stream);

template <typename Element, int kHeadDim>
cudaError_t launch_backward(const AttentionBackwardParams& params, void* workspace, cudaStream_t stream);

}  // namespace jax_flash::cuda_kernels::hopper
