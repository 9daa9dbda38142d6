// Which kernel family may run: JAX_FLASH_KERNELS=sm80 keeps an sm_90 GPU on the sm80 tensor-core kernels, so that
// path can be tested and timed on Hopper too; "auto" (the default) lets sm_90 use the Hopper kernels.
// jax_flash/_ffi.py rejects any other value at import. Read once per process.
#pragma once

#include <cstdlib>
#include <cstring>

namespace jax_flash::cuda_kernels {

inline bool hopper_kernels_allowed() {
  static const bool allowed = [] {
    const char* choice = std::getenv("JAX_FLASH_KERNELS");
    return choice == nullptr || std::strcmp(choice, "sm80") != 0;
  }();
  return allowed;
}

}  // namespace jax_flash::cuda_kernels
