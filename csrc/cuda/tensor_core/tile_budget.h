// The tensor-core kernels' two tile tables (generate_instantiations.py): kLarge for GPUs whose blocks may use 163 KB
// of shared memory or more (sm80, sm87, sm90), kSmall in the head-dim buckets where a kernel of the large table
// needs more than the 99 KB of sm86 and sm89. Picked per launch from the current device.
#pragma once

#include <cuda_runtime.h>

#include "../kernel_choice.h"

namespace jax_flash::cuda_kernels::tensor_core {

enum class TileBudget { kLarge, kSmall };

// The table for kernels whose large tiles need `large_bytes` of shared memory per block: large where they fit.
inline cudaError_t tile_budget(int large_bytes, TileBudget* budget) {
  int limit = 0;
  if (cudaError_t status = block_shared_memory_limit(&limit); status != cudaSuccess) return status;
  *budget = large_bytes <= limit ? TileBudget::kLarge : TileBudget::kSmall;
  return cudaSuccess;
}

}  // namespace jax_flash::cuda_kernels::tensor_core
