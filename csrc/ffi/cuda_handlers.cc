// CUDA handlers: decode operands into params and launch on XLA's stream. They never synchronize the stream and take
// device memory only from XLA (outputs and the scratch allocator).
#include <string>

#include <cuda_runtime.h>

#include "../cuda/attention_cuda.h"
#include "attention_operands.h"
#include "handlers.h"
#include "scratch.h"

namespace jax_flash {
namespace {

ffi::Error launch_status(const char* what, cudaError_t status) {
  if (status == cudaSuccess) return ffi::Error::Success();
  if (status == cudaErrorNotSupported)
    return ffi::Error(ffi::ErrorCode::kUnimplemented,
                      std::string("jax_flash: ") + what + ": this build has no CUDA kernel for this dtype and head_dim "
                      "(it was pruned with JAX_FLASH_HEAD_DIMS / JAX_FLASH_DTYPES at build time)");
  return ffi::Error::Internal(std::string("jax_flash: ") + what + " failed: " + cudaGetErrorString(status));
}

ffi::Error forward_cuda(cudaStream_t stream, ffi::ScratchAllocator scratch, ffi::AnyBuffer q, ffi::AnyBuffer k,
                        ffi::AnyBuffer v, ffi::RemainingArgs tokens, ffi::Result<ffi::AnyBuffer> out,
                        ffi::Result<ffi::Buffer<ffi::F32>> lse, AttentionAttrs attrs) {
  AttentionForwardParams params{};
  if (auto error = decode_forward(kCudaLimits, q, k, v, tokens, *out, *lse, attrs, &params); error.failure())
    return error;
  void* workspace;
  if (auto error = allocate_scratch(scratch, attention_forward_workspace_bytes(params.shape, params.tokens),
                                    "forward workspace", &workspace);
      error.failure())
    return error;
  return launch_status("attention forward launch", launch_attention_forward(params, workspace, stream));
}

ffi::Error fp8_forward_cuda(cudaStream_t stream, ffi::ScratchAllocator scratch, ffi::AnyBuffer q, ffi::AnyBuffer k,
                            ffi::AnyBuffer v, ffi::Buffer<ffi::F32> descale, ffi::RemainingArgs tokens,
                            ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::Buffer<ffi::F32>> lse,
                            AttentionAttrs attrs) {
  AttentionForwardParams params{};
  if (auto error = decode_fp8_forward(kCudaLimits, q, k, v, descale, tokens, *out, *lse, attrs, &params);
      error.failure())
    return error;
  void* workspace;
  if (auto error = allocate_scratch(scratch, attention_forward_fp8_workspace_bytes(params.shape, params.tokens),
                                    "FP8 forward workspace", &workspace);
      error.failure())
    return error;
  const cudaError_t status = launch_attention_forward_fp8(params, workspace, stream);
  if (status == cudaErrorNotSupported)
    return ffi::Error(ffi::ErrorCode::kUnimplemented,
                      "jax_flash: the FP8 forward runs only on sm_90 GPUs with head_dim a multiple of 16 up to 128, "
                      "in builds with sm_90a and fp8 kernels");
  return launch_status("FP8 attention forward launch", status);
}

ffi::Error backward_cuda(cudaStream_t stream, ffi::ScratchAllocator scratch, ffi::AnyBuffer dout, ffi::AnyBuffer q,
                         ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer out, ffi::Buffer<ffi::F32> lse,
                         ffi::RemainingArgs tokens, ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                         ffi::Result<ffi::AnyBuffer> dv, AttentionAttrs attrs) {
  AttentionBackwardParams params{};
  if (auto error = decode_backward(kCudaLimits, dout, q, k, v, out, lse, tokens, *dq, *dk, *dv, attrs, &params);
      error.failure())
    return error;
  void* workspace;
  if (auto error = allocate_scratch(scratch, attention_backward_workspace_bytes(params.shape, params.tokens,
                                                                               params.deterministic),
                                    "backward workspace", &workspace);
      error.failure())
    return error;
  return launch_status("attention backward launch", launch_attention_backward(params, workspace, stream));
}

}  // namespace
}  // namespace jax_flash

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_flash_attention_forward_cuda, jax_flash::forward_cuda,
                              jax_flash::bind_forward_operands(xla::ffi::Ffi::Bind()
                                                                   .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                                                   .Ctx<xla::ffi::ScratchAllocator>()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_flash_attention_backward_cuda, jax_flash::backward_cuda,
                              jax_flash::bind_backward_operands(xla::ffi::Ffi::Bind()
                                                                    .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                                                    .Ctx<xla::ffi::ScratchAllocator>()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_flash_attention_fp8_forward_cuda, jax_flash::fp8_forward_cuda,
                              jax_flash::bind_forward_operands<true>(xla::ffi::Ffi::Bind()
                                                                         .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                                                         .Ctx<xla::ffi::ScratchAllocator>()));
