// The compiled extension: exports each FFI handler as a capsule for jax.ffi.register_ffi_target, plus build facts.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "ffi/handlers.h"

namespace nb = nanobind;

namespace {

template <typename Fn>
nb::capsule handler_capsule(Fn* fn) {
  return nb::capsule(reinterpret_cast<void*>(fn));
}

}  // namespace

NB_MODULE(_jax_flash_ext, m) {
  m.def("cpu_handlers", [] {
    nb::dict handlers;
    handlers["jax_flash_attention_fwd_cpu"] = handler_capsule(jax_flash_attention_forward_cpu);
    handlers["jax_flash_attention_bwd_cpu"] = handler_capsule(jax_flash_attention_backward_cpu);
    handlers["jax_flash_decode_cpu"] = handler_capsule(jax_flash_decode_cpu);
    handlers["jax_flash_kv_cache_update_cpu"] = handler_capsule(jax_flash_kv_cache_update_cpu);
    return handlers;
  });
  m.def("cuda_handlers", [] {
    nb::dict handlers;
#ifdef JAX_FLASH_WITH_CUDA
    handlers["jax_flash_attention_fwd_cuda"] = handler_capsule(jax_flash_attention_forward_cuda);
    handlers["jax_flash_attention_bwd_cuda"] = handler_capsule(jax_flash_attention_backward_cuda);
    handlers["jax_flash_attention_fp8_fwd_cuda"] = handler_capsule(jax_flash_attention_fp8_forward_cuda);
    handlers["jax_flash_decode_cuda"] = handler_capsule(jax_flash_decode_cuda);
    handlers["jax_flash_kv_cache_update_cuda"] = handler_capsule(jax_flash_kv_cache_update_cuda);
#endif
    return handlers;
  });
  m.attr("cuda_architectures") = JAX_FLASH_CUDA_ARCHITECTURES;
#ifdef JAX_FLASH_WITH_HOPPER
  m.attr("hopper_kernels") = true;
#else
  m.attr("hopper_kernels") = false;
#endif
#if defined(JAX_FLASH_WITH_HOPPER) && defined(JAX_FLASH_DTYPE_FP8)
  m.attr("fp8_kernels") = true;
#else
  m.attr("fp8_kernels") = false;
#endif
}
