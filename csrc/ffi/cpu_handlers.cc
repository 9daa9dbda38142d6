// CPU handlers: decode operands into params and run the CPU kernels on XLA's own intra-op thread pool.
#include "../cpu/attention_cpu.h"
#include "attention_operands.h"
#include "cpu_parallel.h"
#include "handlers.h"

namespace jax_flash {
namespace {

ffi::Error forward_cpu(ffi::ThreadPool pool, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                       ffi::RemainingArgs tokens, ffi::Result<ffi::AnyBuffer> out,
                       ffi::Result<ffi::Buffer<ffi::F32>> lse, AttentionAttrs attrs) {
  AttentionForwardParams params{};
  if (auto error = decode_forward(kCpuLimits, q, k, v, tokens, *out, *lse, attrs, &params); error.failure())
    return error;
  attention_forward_cpu(params, worker_count(pool), pool_parallel_for(pool));
  return ffi::Error::Success();
}

ffi::Error backward_cpu(ffi::ThreadPool pool, ffi::AnyBuffer dout, ffi::AnyBuffer q, ffi::AnyBuffer k,
                        ffi::AnyBuffer v, ffi::AnyBuffer out, ffi::Buffer<ffi::F32> lse, ffi::RemainingArgs tokens,
                        ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk, ffi::Result<ffi::AnyBuffer> dv,
                        AttentionAttrs attrs) {
  AttentionBackwardParams params{};
  if (auto error = decode_backward(kCpuLimits, dout, q, k, v, out, lse, tokens, *dq, *dk, *dv, attrs, &params);
      error.failure())
    return error;
  attention_backward_cpu(params, worker_count(pool), pool_parallel_for(pool));
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jax_flash

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_flash_attention_forward_cpu, jax_flash::forward_cpu,
                              jax_flash::bind_forward_operands(xla::ffi::Ffi::Bind().Ctx<xla::ffi::ThreadPool>()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_flash_attention_backward_cpu, jax_flash::backward_cpu,
                              jax_flash::bind_backward_operands(xla::ffi::Ffi::Bind().Ctx<xla::ffi::ThreadPool>()));
