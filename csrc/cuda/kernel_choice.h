// Which kernels may run, from JAX_FLASH_KERNELS (read once per process; jax_flash/_ffi.py rejects any other value
// at import):
// * "auto" (the default): sm_90 GPUs use the Hopper kernels, every GPU the shared memory its blocks may use;
// * "sm80": sm_90 GPUs stay on the sm80 tensor-core kernels, so that path can be tested and timed on Hopper too;
// * "sm86": the same, and every GPU is held to the 99 KB of shared memory a block of sm86 and sm89 GPUs may use, so
//   the tiles and decode plans chosen for those GPUs can be tested and timed on larger ones.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include <cuda_runtime.h>

#include "device_attribute.h"

namespace jax_flash::cuda_kernels {

// The most shared memory a block of an sm86 or sm89 GPU may opt into.
inline constexpr int kSm86BlockSharedBytes = 99 * 1024;

inline bool kernels_chosen(const char* choice) {
  const char* chosen = std::getenv("JAX_FLASH_KERNELS");
  return chosen != nullptr && std::strcmp(chosen, choice) == 0;
}

inline bool hopper_kernels_allowed() {
  static const bool allowed = !kernels_chosen("sm80") && !kernels_chosen("sm86");
  return allowed;
}

// *bytes = the shared memory a block may opt into on the current device, as the kernel choice allows.
inline cudaError_t block_shared_memory_limit(int* bytes) {
  static const bool sm86_limit = kernels_chosen("sm86");
  if (cudaError_t status = device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>(bytes); status != cudaSuccess)
    return status;
  if (sm86_limit) *bytes = std::min(*bytes, kSm86BlockSharedBytes);
  return cudaSuccess;
}

}  // namespace jax_flash::cuda_kernels
