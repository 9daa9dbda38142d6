// Device scratch for the CUDA handlers, always from XLA's allocator (never cudaMalloc behind XLA's back).
#pragma once

#include <cstddef>
#include <string>

#include "xla/ffi/api/ffi.h"

namespace jax_flash {

namespace ffi = ::xla::ffi;

// Sets *data to `bytes` of scratch, or to nullptr when bytes is 0.
inline ffi::Error allocate_scratch(ffi::ScratchAllocator& scratch, size_t bytes, const char* what, void** data) {
  *data = nullptr;
  if (bytes == 0) return ffi::Error::Success();
  auto allocation = scratch.Allocate(bytes);
  if (!allocation.has_value())
    return ffi::Error::Internal("jax_flash: could not allocate " + std::to_string(bytes) + " bytes of " + what);
  *data = *allocation;
  return ffi::Error::Success();
}

}  // namespace jax_flash
