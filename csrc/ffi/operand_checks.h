// The checks that every custom call's operand decoding repeats: error messages naming shapes, shape and dtype
// comparisons, and what each platform's kernels accept.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "../attention_params.h"
#include "xla/ffi/api/ffi.h"

namespace jax_flash {

namespace ffi = ::xla::ffi;

// What a platform's kernels accept beyond the common rules.
struct PlatformLimits {
  int64_t max_head_dim;
  int64_t head_dim_multiple;
};
inline constexpr PlatformLimits kCpuLimits{256, 1};
inline constexpr PlatformLimits kCudaLimits{256, 8};

// "[2, 3, 4]"
std::string dims_string(ffi::Span<const int64_t> dims);

// An InvalidArgument error whose message says it comes from jax_flash.
ffi::Error invalid(const std::string& message);

// `name` must have exactly the dimensions `expected`.
ffi::Error check_dims(const char* name, ffi::Span<const int64_t> dims, ffi::Span<const int64_t> expected);
ffi::Error check_dims(const char* name, ffi::Span<const int64_t> dims, std::initializer_list<int64_t> expected);

// The kernels' element type of a float32, float16 or bfloat16 buffer.
ffi::Error element_dtype(ffi::DataType type, DType* dtype);

// head_dim within the platform's limits.
ffi::Error check_head_dim(const PlatformLimits& limits, int64_t head_dim);

}  // namespace jax_flash
