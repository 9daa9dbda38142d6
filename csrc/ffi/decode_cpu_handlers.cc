// CPU handlers of decode and the KV cache update, on XLA's intra-op thread pool like the attention handlers.
#include "../cpu/decode_cpu.h"
#include "cpu_parallel.h"
#include "decode_operands.h"
#include "handlers.h"

namespace jax_flash {
namespace {

ffi::Error decode_cpu_handler(ffi::ThreadPool pool, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                              ffi::Buffer<ffi::S32> lengths, ffi::Buffer<ffi::S32> page_table,
                              ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::Buffer<ffi::F32>> lse,
                              AttentionAttrs attrs) {
  DecodeParams params{};
  if (auto error = decode_decode(kCpuLimits, q, k, v, lengths, page_table, *out, *lse, attrs, &params);
      error.failure())
    return error;
  decode_cpu(params, worker_count(pool), pool_parallel_for(pool));
  return ffi::Error::Success();
}

ffi::Error kv_cache_update_cpu_handler(ffi::ThreadPool pool, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer new_k,
                                       ffi::AnyBuffer new_v, ffi::Buffer<ffi::S32> positions,
                                       ffi::Buffer<ffi::S32> page_table, ffi::Result<ffi::AnyBuffer> k_out,
                                       ffi::Result<ffi::AnyBuffer> v_out) {
  KvCacheUpdateParams params{};
  if (auto error = decode_kv_cache_update(kCpuLimits, k, v, new_k, new_v, positions, page_table, *k_out, *v_out,
                                          &params);
      error.failure())
    return error;
  kv_cache_update_cpu(params, pool_parallel_for(pool));
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jax_flash

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_flash_decode_cpu, jax_flash::decode_cpu_handler,
                              jax_flash::bind_decode_operands(xla::ffi::Ffi::Bind().Ctx<xla::ffi::ThreadPool>()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    jax_flash_kv_cache_update_cpu, jax_flash::kv_cache_update_cpu_handler,
    jax_flash::bind_kv_cache_update_operands(xla::ffi::Ffi::Bind().Ctx<xla::ffi::ThreadPool>()));
