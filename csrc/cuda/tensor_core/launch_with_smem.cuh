// The one way the tensor-core kernels are launched: a 1-D grid and opted-in dynamic shared memory.
#pragma once

#include <climits>
#include <cstdint>

#include <cuda_runtime.h>

namespace jax_flash::cuda_kernels::tensor_core {

// Launches `kernel` over `blocks` blocks of `threads` with `smem_bytes` of dynamic shared memory, or does nothing
// when there is no work; returns the launch error. One grid axis: gridDim.x has room for any batch * heads * tiles.
template <typename... KernelParams, typename... Args>
cudaError_t launch_with_smem(void (*kernel)(KernelParams...), int64_t blocks, int threads, int smem_bytes,
                             cudaStream_t stream, const Args&... args) {
  if (blocks == 0) return cudaSuccess;
  if (blocks > INT_MAX) return cudaErrorInvalidValue;
  // Set per launch rather than once: the attribute belongs to the current device, and a process may use several.
  cudaError_t status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (status != cudaSuccess) return status;
  kernel<<<static_cast<unsigned>(blocks), threads, smem_bytes, stream>>>(args...);
  return cudaGetLastError();
}

}  // namespace jax_flash::cuda_kernels::tensor_core
