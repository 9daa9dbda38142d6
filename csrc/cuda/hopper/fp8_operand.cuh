// P = softmax(S) as the e4m3 register operand of the FP8 P V wgmma, without moving values between threads.
//
// An 8-bit wgmma reads its register A operand 32 columns (keys) at a time: per thread four registers of four bytes,
// register (h, half) holding row r + 8h at the four consecutive keys 16 half + 4q + 0..3 (q = lane % 4). The float32
// accumulator of S gives the same thread, per row and per 32 keys, the keys 8i + 2q + {0, 1} for i = 0..3: the same
// count per row, a different set. Instead of exchanging values across lanes, each thread packs its own eight keys per
// row into its eight operand slots, which permutes the keys within every 32-key block; the value tile is stored
// transposed with its keys in that same order (fp8_value_transpose.cu), so P V sums the same products.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>

namespace jax_flash::cuda_kernels::hopper {

using namespace cute;

// The key that operand slot `slot` (0..31) of a 32-key block carries: bytes (j & 1) of column pairs 2q and 2q + 8,
// over the two 16-key halves.
__host__ __device__ constexpr int fp8_operand_key(int slot) {
  const int half = slot / 16, quad = slot % 16 / 4, byte = slot % 4;
  return 16 * half + 8 * (byte >> 1) + 2 * quad + (byte & 1);
}

// The register A operand of a k32 8-bit wgmma, ((4 bytes, 2 row halves, 2 key halves), MMA_M, keys / 32), for an
// accumulator ((2 columns, 2 row halves, N / 8), MMA_M, 1).
template <class Layout>
__device__ __forceinline__ constexpr auto fp8_operand_a(Layout acc) {
  static_assert(decltype(size<2>(acc))::value == 1, "one accumulator tile across the keys");
  constexpr int kKeyBlocks = decltype(size<0, 2>(acc))::value / 4;
  return make_layout(make_shape(make_shape(_4{}, _2{}, _2{}), shape<1>(acc), Int<kKeyBlocks>{}));
}

// Four floats to four e4m3 bytes, the first in the lowest byte (cvt puts its first source in the upper byte).
__device__ __forceinline__ uint32_t pack_e4m3x4(float b0, float b1, float b2, float b3) {
  uint16_t low, high;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %2, %1;" : "=h"(low) : "f"(b0), "f"(b1));
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %2, %1;" : "=h"(high) : "f"(b2), "f"(b3));
  return uint32_t(low) | uint32_t(high) << 16;
}

// operand = multiplier * accumulator in the slot order of fp8_operand_key. The multiplier lifts P (at most 1) into
// e4m3's range so that small probabilities keep their bits; the caller divides the output by it.
template <class Accumulator, class Operand>
__device__ __forceinline__ void convert_to_fp8_operand(Accumulator const& acc, Operand& operand, float multiplier) {
  constexpr int kRowTiles = decltype(size<1>(acc))::value;
  constexpr int kKeyBlocks = decltype(size<0, 2>(acc))::value / 4;
  static_assert(decltype(size(operand))::value == decltype(size(acc))::value);
  uint32_t* registers = reinterpret_cast<uint32_t*>(raw_pointer_cast(operand.data()));
  CUTE_UNROLL
  for (int m = 0; m < kRowTiles; ++m) {
    CUTE_UNROLL
    for (int block = 0; block < kKeyBlocks; ++block) {
      // Column c of column pair i (8 keys apart) of row half h, within this 32-key block.
      auto at = [&](int h, int i, int c) { return acc(make_coord(c, h, 4 * block + i), m, 0) * multiplier; };
      CUTE_UNROLL
      for (int half = 0; half < 2; ++half) {
        CUTE_UNROLL
        for (int h = 0; h < 2; ++h) {
          registers[h + 2 * half + 4 * (m + kRowTiles * block)] =
              pack_e4m3x4(at(h, 2 * half, 0), at(h, 2 * half, 1), at(h, 2 * half + 1, 0), at(h, 2 * half + 1, 1));
        }
      }
    }
  }
}

}  // namespace jax_flash::cuda_kernels::hopper
