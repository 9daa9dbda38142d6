// Device attributes that launch paths ask for on every call (SM count, compute capability, shared-memory limit),
// read from the driver once per device and then served from a cache.
#pragma once

#include <atomic>

#include <cuda_runtime.h>

namespace jax_flash::cuda_kernels {

// *value = kAttribute of the current device. The cache holds value + 1, so 0 means "not read yet" and attributes
// that are legitimately 0 (a compute capability's minor number) are cached too.
template <cudaDeviceAttr kAttribute>
cudaError_t device_attribute(int* value) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cached[kMaxDevices] = {};
  int device = 0;
  if (cudaError_t status = cudaGetDevice(&device); status != cudaSuccess) return status;
  if (device < kMaxDevices) {
    if (const int known = cached[device].load(std::memory_order_relaxed); known != 0) {
      *value = known - 1;
      return cudaSuccess;
    }
  }
  if (cudaError_t status = cudaDeviceGetAttribute(value, kAttribute, device); status != cudaSuccess) return status;
  if (device < kMaxDevices) cached[device].store(*value + 1, std::memory_order_relaxed);
  return cudaSuccess;
}

}  // namespace jax_flash::cuda_kernels
