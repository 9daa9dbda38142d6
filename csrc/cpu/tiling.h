// Tile sizes of the CPU kernels: a query tile is the unit of parallel work, a key tile the unit of streaming.
#pragma once

#include <cstdint>

namespace jax_flash::cpu {

// 96 query rows = 16 blocks of the 6-row GEMM micro-kernel; 64 keys keep a tile of S in L1 next to the operands.
inline constexpr int64_t kQueryTile = 96;
inline constexpr int64_t kKeyTile = 64;

}  // namespace jax_flash::cpu
