#include "operand_checks.h"

#include <sstream>

namespace jax_flash {

std::string dims_string(ffi::Span<const int64_t> dims) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < dims.size(); ++i) out << (i ? ", " : "") << dims[i];
  out << "]";
  return out.str();
}

ffi::Error invalid(const std::string& message) { return ffi::Error::InvalidArgument("jax_flash: " + message); }

ffi::Error check_dims(const char* name, ffi::Span<const int64_t> dims, ffi::Span<const int64_t> expected) {
  if (dims == expected) return ffi::Error::Success();
  return invalid(std::string(name) + " has shape " + dims_string(dims) + ", expected " + dims_string(expected));
}

ffi::Error check_dims(const char* name, ffi::Span<const int64_t> dims, std::initializer_list<int64_t> expected) {
  return check_dims(name, dims, ffi::Span<const int64_t>(expected.begin(), expected.size()));
}

ffi::Error element_dtype(ffi::DataType type, DType* dtype) {
  switch (type) {
    case ffi::DataType::F32: *dtype = DType::kFloat32; return ffi::Error::Success();
    case ffi::DataType::F16: *dtype = DType::kFloat16; return ffi::Error::Success();
    case ffi::DataType::BF16: *dtype = DType::kBFloat16; return ffi::Error::Success();
    default: return invalid("dtype must be float32, float16 or bfloat16");
  }
}

ffi::Error check_head_dim(const PlatformLimits& limits, int64_t head_dim) {
  if (head_dim <= limits.max_head_dim && head_dim % limits.head_dim_multiple == 0) return ffi::Error::Success();
  return invalid("head_dim " + std::to_string(head_dim) + " unsupported on this platform (at most " +
                 std::to_string(limits.max_head_dim) + ", a multiple of " + std::to_string(limits.head_dim_multiple) +
                 ")");
}

}  // namespace jax_flash
