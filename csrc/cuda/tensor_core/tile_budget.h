// The tensor-core kernels' two tile tables (generate_instantiations.py): kLarge for GPUs whose blocks may use 163 KB
// of shared memory or more (sm80, sm87, sm90), kSmall in the head-dim buckets where a kernel of the large table
// needs more than the 99 KB of sm86 and sm89. Picked per launch from the current device.
#pragma once

#include <type_traits>

#include <cuda_runtime.h>

#include "../kernel_choice.h"

namespace jax_flash::cuda_kernels::tensor_core {

enum class TileBudget { kLarge, kSmall };

// launch(std::integral_constant<TileBudget, ...>{}) with the table the current device takes, for kernels whose large
// tiles need kLargeBytes of shared memory per block. Where those fit every GPU's 99 KB, only the large table exists.
template <int kLargeBytes, class Launch>
cudaError_t launch_with_tile_budget(Launch&& launch) {
  using Large = std::integral_constant<TileBudget, TileBudget::kLarge>;
  if constexpr (kLargeBytes <= kSm86BlockSharedBytes) {
    return launch(Large{});
  } else {
    int limit = 0;
    if (cudaError_t status = block_shared_memory_limit(&limit); status != cudaSuccess) return status;
    return kLargeBytes <= limit ? launch(Large{}) : launch(std::integral_constant<TileBudget, TileBudget::kSmall>{});
  }
}

}  // namespace jax_flash::cuda_kernels::tensor_core
