// Launch interface of the CUDA attention kernels. FFI handlers call only these functions; the kernels behind them
// may change (simple kernel now, tensor-core kernels later) without touching the handlers.
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

#include "../attention_params.h"

namespace jax_flash {

// Device scratch each direction needs, in bytes (the forward's only under a token mask); the caller allocates it
// through XLA and passes it in, 16-byte aligned.
size_t attention_forward_workspace_bytes(const AttentionShape& shape, const TokenMask& tokens);
size_t attention_backward_workspace_bytes(const AttentionShape& shape, const TokenMask& tokens, bool deterministic);

// Return the launch error (never synchronize the stream).
cudaError_t launch_attention_forward(const AttentionForwardParams& params, void* workspace, cudaStream_t stream);

cudaError_t launch_attention_backward(const AttentionBackwardParams& params, void* workspace, cudaStream_t stream);

// The FP8 forward: e4m3 q, k, v with params.descale, bfloat16 out. Only the Hopper kernel exists: anything else
// (another GPU, head_dim above 128 or not a multiple of 16, a build without sm_90a or without fp8) answers
// cudaErrorNotSupported, which Python rules out before lowering.
size_t attention_forward_fp8_workspace_bytes(const AttentionShape& shape, const TokenMask& tokens);
cudaError_t launch_attention_forward_fp8(const AttentionForwardParams& params, void* workspace, cudaStream_t stream);

}  // namespace jax_flash
