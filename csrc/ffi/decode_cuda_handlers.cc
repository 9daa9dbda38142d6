// CUDA handlers of decode and the KV cache update: decode operands into params and launch on XLA's stream. They
// never synchronize the stream and take device memory only from XLA: decode's workspace for the split partials is a
// third output, sized at trace time (jax_flash/_decode_primitives.py), not a scratch allocation, which would not
// outlive a capture into XLA's command buffers (CUDA graphs). Both handlers are so declared compatible with them
// (kCmdBufferCompatible): XLA captures a decode step with the operations around it into one graph instead of
// splitting the graph at every decode call, which cost a model a launch gap per layer.
#include <string>

#include <cuda_runtime.h>

#include "../cuda/decode_cuda.h"
#include "decode_operands.h"
#include "handlers.h"

namespace jax_flash {
namespace {

ffi::Error cuda_status(const char* what, cudaError_t status) {
  if (status == cudaSuccess) return ffi::Error::Success();
  return ffi::Error::Internal(std::string("jax_flash: ") + what + " failed: " + cudaGetErrorString(status));
}

ffi::Error decode_cuda_handler(cudaStream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                               ffi::Buffer<ffi::S32> lengths, ffi::Buffer<ffi::S32> page_table,
                               ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::Buffer<ffi::F32>> lse,
                               AttentionAttrs attrs, ffi::Result<ffi::Buffer<ffi::F32>> workspace) {
  DecodeParams params{};
  if (auto error = decode_decode(kCudaLimits, q, k, v, lengths, page_table, *out, *lse, attrs, &params);
      error.failure())
    return error;
  DecodePlan plan{};
  if (auto error = cuda_status("decode planning", plan_decode(params, workspace->size_bytes(), &plan));
      error.failure())
    return error;
  return cuda_status("decode launch", launch_decode(params, plan, workspace->untyped_data(), stream));
}

ffi::Error kv_cache_update_cuda_handler(cudaStream_t stream, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer new_k,
                                        ffi::AnyBuffer new_v, ffi::Buffer<ffi::S32> positions,
                                        ffi::Buffer<ffi::S32> page_table, ffi::Result<ffi::AnyBuffer> k_out,
                                        ffi::Result<ffi::AnyBuffer> v_out) {
  KvCacheUpdateParams params{};
  if (auto error = decode_kv_cache_update(kCudaLimits, k, v, new_k, new_v, positions, page_table, *k_out, *v_out,
                                          &params);
      error.failure())
    return error;
  return cuda_status("KV cache update launch", launch_kv_cache_update(params, stream));
}

}  // namespace
}  // namespace jax_flash

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_flash_decode_cuda, jax_flash::decode_cuda_handler,
                              jax_flash::bind_decode_operands(
                                  xla::ffi::Ffi::Bind().Ctx<xla::ffi::PlatformStream<cudaStream_t>>())
                                  .Ret<xla::ffi::Buffer<xla::ffi::F32>>(),
                              {xla::ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    jax_flash_kv_cache_update_cuda, jax_flash::kv_cache_update_cuda_handler,
    jax_flash::bind_kv_cache_update_operands(xla::ffi::Ffi::Bind().Ctx<xla::ffi::PlatformStream<cudaStream_t>>()),
    {xla::ffi::Traits::kCmdBufferCompatible});
