// The launch interface of attention_cuda.h: rejects calls no kernel supports, then routes the rest by dtype:
// fp16 and bf16 run on the Hopper kernels on sm_90 where compiled, else on the sm80 tensor-core kernels; float32 on
// the simple CUDA-core kernels.
#include "attention_cuda.h"

#include <cstdint>

#include "attention_simple.h"
#include "backward_delta.h"
#include "kernel_choice.h"
#include "tensor_core/tensor_core.h"
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

}  // namespace

cudaError_t launch_attention_forward(const AttentionForwardParams& params, cudaStream_t stream) {
  const bool aligned = aligned_16(params.q) && aligned_16(params.k) && aligned_16(params.v);
  if (!supported(params.shape) || !aligned) return cudaErrorInvalidValue;
  if (params.dtype == DType::kFloat32) return cuda_kernels::attention_forward_simple(params, stream);
#if defined(JAX_FLASH_WITH_HOPPER)
  // The Hopper kernels take what they have compiled; per-token masks and other head dims stay on sm80.
  if (!params.tokens.any() && cuda_kernels::hopper_kernels_allowed() && cuda_kernels::hopper::device_supported()) {
    const cudaError_t status = cuda_kernels::hopper::forward(params, stream);
    if (status != cudaErrorNotSupported) return status;
  }
#endif
  return cuda_kernels::tensor_core::forward(params, stream);
}

size_t attention_backward_workspace_bytes(const AttentionShape& shape) {
  const size_t sm80_bytes = cuda_kernels::backward_delta_bytes(shape);
#if defined(JAX_FLASH_WITH_HOPPER)
  // Sized at the handler before the kernel family is chosen, so enough for either.
  const size_t hopper_bytes = cuda_kernels::hopper::backward_workspace_bytes(shape);
  return hopper_bytes > sm80_bytes ? hopper_bytes : sm80_bytes;
#else
  return sm80_bytes;
#endif
}

cudaError_t launch_attention_backward(const AttentionBackwardParams& params, void* workspace, cudaStream_t stream) {
  const bool aligned = aligned_16(params.q) && aligned_16(params.k) && aligned_16(params.v) && aligned_16(params.dout);
  if (!supported(params.shape) || !aligned) return cudaErrorInvalidValue;
  if (params.dtype == DType::kFloat32) return cuda_kernels::attention_backward_simple(params, workspace, stream);
#if defined(JAX_FLASH_WITH_HOPPER)
  if (!params.tokens.any() && cuda_kernels::hopper_kernels_allowed() && cuda_kernels::hopper::device_supported()) {
    const cudaError_t status = cuda_kernels::hopper::backward(params, workspace, stream);
    if (status != cudaErrorNotSupported) return status;
  }
#endif
  return cuda_kernels::tensor_core::backward(params, workspace, stream);
}

}  // namespace jax_flash
