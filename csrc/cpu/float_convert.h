// Conversion between the stored element types and float32, written with plain bit operations so the CPU build
// needs no compiler support for half-precision types.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "../attention_params.h"

namespace jax_flash::cpu {

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float bfloat16_to_float(uint16_t x) { return bits_to_float(uint32_t(x) << 16); }

inline uint16_t float_to_bfloat16(float f) {
  uint32_t u = float_to_bits(f);
  if (std::isnan(f)) return uint16_t((u >> 16) | 0x40);  // keep it a NaN after truncation
  u += 0x7fffu + ((u >> 16) & 1u);                       // round to nearest even
  return uint16_t(u >> 16);
}

inline float float16_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return bits_to_float(sign | 0x7f800000u | (mantissa << 13));  // inf / nan
  if (exponent == 0) {                                                                   // zero / subnormal
    float magnitude = std::ldexp(float(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  return bits_to_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

inline uint16_t float_to_float16(float f) {
  uint32_t u = float_to_bits(f);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  float a = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7e00u;
  if (a >= 65520.f) return sign | 0x7c00u;  // rounds to infinity
  if (a < 6.103515625e-05f) {               // subnormal half: scale so the integer part is the mantissa
    return sign | uint16_t(std::nearbyint(a * 16777216.f));
  }
  uint32_t bits = float_to_bits(a);
  bits += 0xfffu + ((bits >> 13) & 1u);  // round to nearest even at bit 13
  return sign | uint16_t(((bits >> 13) - (112u << 10)));
}

// Reads n elements of `dtype` starting at element `offset` of `base`, multiplied by `factor`, into dst.
inline void load_floats(DType dtype, const void* base, int64_t offset, int64_t n, float factor, float* dst) {
  switch (dtype) {
    case DType::kFloat32: {
      const float* src = static_cast<const float*>(base) + offset;
      for (int64_t i = 0; i < n; ++i) dst[i] = src[i] * factor;
      return;
    }
    case DType::kFloat16: {
      const uint16_t* src = static_cast<const uint16_t*>(base) + offset;
      for (int64_t i = 0; i < n; ++i) dst[i] = float16_to_float(src[i]) * factor;
      return;
    }
    case DType::kBFloat16: {
      const uint16_t* src = static_cast<const uint16_t*>(base) + offset;
      for (int64_t i = 0; i < n; ++i) dst[i] = bfloat16_to_float(src[i]) * factor;
      return;
    }
  }
}

// Writes n floats, multiplied by `factor`, as `dtype` at element `offset` of `base`.
inline void store_floats(DType dtype, const float* src, float factor, int64_t n, void* base, int64_t offset) {
  switch (dtype) {
    case DType::kFloat32: {
      float* dst = static_cast<float*>(base) + offset;
      for (int64_t i = 0; i < n; ++i) dst[i] = src[i] * factor;
      return;
    }
    case DType::kFloat16: {
      uint16_t* dst = static_cast<uint16_t*>(base) + offset;
      for (int64_t i = 0; i < n; ++i) dst[i] = float_to_float16(src[i] * factor);
      return;
    }
    case DType::kBFloat16: {
      uint16_t* dst = static_cast<uint16_t*>(base) + offset;
      for (int64_t i = 0; i < n; ++i) dst[i] = float_to_bfloat16(src[i] * factor);
      return;
    }
  }
}

}  // namespace jax_flash::cpu
