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

}  // namespace jax_flash
