// The launch interface of attention_cuda.h: rejects calls no kernel supports, then routes the rest by dtype:
// fp16 and bf16 run on the Hopper kernels on sm_90 where compiled, else on the sm80 tensor-core kernels; float32 on
// the simple CUDA-core kernels; FP8 (e4m3) only on the Hopper forward.
#include "attention_cuda.h"

#include <cstdint>

#include "attention_simple.h"
#include "backward_delta.h"
#include "kernel_choice.h"
#include "tensor_core/tensor_core.h"
#include "token_chunks.h"
#if defined(JAX_FLASH_WITH_HOPPER)
#include "hopper/hopper.h"
#endif

namespace jax_flash {
namespace {

// The kernels stage rows of q, k, v and dout into shared memory with 16-byte loads.
bool aligned_16(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer) % 16 == 0; }

// A backstop: the FFI handlers validate shapes first, so reaching `false` here is a bug upstream.
bool supported(const AttentionShape& shape) {
  return shape.batch >= 0 && shape.seqlen_q >= 0 && shape.seqlen_k >= 0 && shape.heads_kv > 0 &&
         shape.heads_q >= 0 && shape.heads_q % shape.heads_kv == 0 && shape.head_dim >= 8 &&
         shape.head_dim <= 256 && shape.head_dim % 8 == 0;
}

// Where the token-mask chunk summaries start in a workspace that holds `kernel_bytes` of other scratch first.
size_t chunks_offset(size_t kernel_bytes) { return (kernel_bytes + 255) / 256 * 256; }

size_t forward_kernel_workspace_bytes() {
#if defined(JAX_FLASH_WITH_HOPPER)
  return cuda_kernels::hopper::forward_workspace_bytes();
#else
  return 0;
#endif
}

size_t backward_kernel_workspace_bytes(const AttentionShape& shape, bool deterministic) {
  const size_t sm80_bytes = cuda_kernels::backward_delta_bytes(shape);
#if defined(JAX_FLASH_WITH_HOPPER)
  // Sized at the handler before the kernel family is chosen, so enough for either.
  const size_t hopper_bytes = cuda_kernels::hopper::backward_workspace_bytes(shape, deterministic);
  return hopper_bytes > sm80_bytes ? hopper_bytes : sm80_bytes;
#else
  return sm80_bytes;
#endif
}

// Workspaces hold the kernels' own scratch, then the chunk summaries when there is a token mask.
size_t workspace_bytes(size_t kernel_bytes, const AttentionShape& shape, const TokenMask& tokens) {
  const size_t chunk_bytes = cuda_kernels::token_chunks_bytes(shape, tokens);
  return chunk_bytes > 0 ? chunks_offset(kernel_bytes) + chunk_bytes : kernel_bytes;
}

}  // namespace

size_t attention_forward_workspace_bytes(const AttentionShape& shape, const TokenMask& tokens) {
  return workspace_bytes(forward_kernel_workspace_bytes(), shape, tokens);
}

size_t attention_backward_workspace_bytes(const AttentionShape& shape, const TokenMask& tokens, bool deterministic) {
  return workspace_bytes(backward_kernel_workspace_bytes(shape, deterministic), shape, tokens);
}

cudaError_t launch_attention_forward(const AttentionForwardParams& call, void* workspace, cudaStream_t stream) {
  const bool aligned = aligned_16(call.q) && aligned_16(call.k) && aligned_16(call.v);
  if (!supported(call.shape) || !aligned) return cudaErrorInvalidValue;
  if (call.dtype == DType::kFloat32) return cuda_kernels::attention_forward_simple(call, stream);
  AttentionForwardParams params = call;
  void* chunks = static_cast<char*>(workspace) + chunks_offset(forward_kernel_workspace_bytes());
  if (const cudaError_t status = cuda_kernels::summarize_token_chunks(params.shape, &params.tokens, chunks, stream);
      status != cudaSuccess)
    return status;
#if defined(JAX_FLASH_WITH_HOPPER)
  // The Hopper kernels take what they have compiled; other head dims stay on sm80.
  if (cuda_kernels::hopper_kernels_allowed() && cuda_kernels::hopper::device_supported()) {
    const cudaError_t status = cuda_kernels::hopper::forward(params, workspace, stream);
    if (status != cudaErrorNotSupported) return status;
  }
#endif
  return cuda_kernels::tensor_core::forward(params, stream);
}

size_t attention_forward_fp8_workspace_bytes(const AttentionShape& shape, const TokenMask& tokens) {
#if defined(JAX_FLASH_WITH_HOPPER)
  return workspace_bytes(cuda_kernels::hopper::forward_fp8_workspace_bytes(shape), shape, tokens);
#else
  return 0;
#endif
}

cudaError_t launch_attention_forward_fp8(const AttentionForwardParams& call, void* workspace, cudaStream_t stream) {
  const bool aligned = aligned_16(call.q) && aligned_16(call.k) && aligned_16(call.v);
  if (!supported(call.shape) || !aligned) return cudaErrorInvalidValue;
#if defined(JAX_FLASH_WITH_HOPPER)
  if (!cuda_kernels::hopper_kernels_allowed() || !cuda_kernels::hopper::device_supported() ||
      !cuda_kernels::hopper::forward_fp8_supported(call.shape))
    return cudaErrorNotSupported;
  AttentionForwardParams params = call;
  void* chunks =
      static_cast<char*>(workspace) + chunks_offset(cuda_kernels::hopper::forward_fp8_workspace_bytes(call.shape));
  if (const cudaError_t status = cuda_kernels::summarize_token_chunks(params.shape, &params.tokens, chunks, stream);
      status != cudaSuccess)
    return status;
  return cuda_kernels::hopper::forward_fp8(params, workspace, stream);
#else
  return cudaErrorNotSupported;
#endif
}

cudaError_t launch_attention_backward(const AttentionBackwardParams& call, void* workspace, cudaStream_t stream) {
  const bool aligned = aligned_16(call.q) && aligned_16(call.k) && aligned_16(call.v) && aligned_16(call.dout);
  if (!supported(call.shape) || !aligned) return cudaErrorInvalidValue;
  if (call.dtype == DType::kFloat32) return cuda_kernels::attention_backward_simple(call, workspace, stream);
  AttentionBackwardParams params = call;
  void* chunks = static_cast<char*>(workspace) +
                 chunks_offset(backward_kernel_workspace_bytes(params.shape, params.deterministic));
  if (const cudaError_t status = cuda_kernels::summarize_token_chunks(params.shape, &params.tokens, chunks, stream);
      status != cudaSuccess)
    return status;
#if defined(JAX_FLASH_WITH_HOPPER)
  if (cuda_kernels::hopper_kernels_allowed() && cuda_kernels::hopper::device_supported()) {
    const cudaError_t status = cuda_kernels::hopper::backward(params, workspace, stream);
    if (status != cudaErrorNotSupported) return status;
  }
#endif
  return cuda_kernels::tensor_core::backward(params, workspace, stream);
}

}  // namespace jax_flash
