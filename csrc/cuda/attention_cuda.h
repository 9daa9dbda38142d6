// Launch interface of the CUDA attention kernels. FFI handlers call only these functions; the kernels behind them
// may change (simple kernel now, tensor-core kernels later) without touching the handlers.
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

#include "../attention_params.h"

namespace jax_flash {

// Returns the launch error (never synchronizes the stream).
cudaError_t launch_attention_forward(const AttentionForwardParams& params, cudaStream_t stream);

// Device scratch the backward needs, in bytes; the caller allocates it through XLA and passes it in.
size_t attention_backward_workspace_bytes(const AttentionShape& shape);

cudaError_t launch_attention_backward(const AttentionBackwardParams& params, void* workspace, cudaStream_t stream);

}  // namespace jax_flash
