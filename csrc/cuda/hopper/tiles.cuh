// Pieces both Hopper kernels are built from: how the TMA sees the global tensors, the swizzled shared-memory tiles
// the wgmma reads, and the split of a CTA into a producer warpgroup and consumer warpgroups.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>

namespace jax_flash::cuda_kernels::hopper {

using namespace cute;

// Global tensors are [batch, seq, heads, head_dim]; the TMA views them as (seq, head_dim, heads, batch) so a tile is
// a (rows, head_dim) box at fixed (head, batch). Extents are int32 (the handlers bound them), strides int64.
using GlobalShape = Shape<int32_t, int32_t, int32_t, int32_t>;
using GlobalStride = Stride<int64_t, _1, int64_t, int64_t>;

template <typename Element>
CUTE_HOST_DEVICE auto global_tensor(const void* data, GlobalShape shape) {
  const int64_t row = int64_t(get<2>(shape)) * get<1>(shape);  // heads * head_dim elements between sequence rows
  return make_tensor(make_gmem_ptr(static_cast<Element const*>(data)), shape,
                     GlobalStride(row, _1{}, int64_t(get<1>(shape)), row * get<0>(shape)));
}

template <typename Element>
using GlobalTensor = decltype(global_tensor<Element>(nullptr, GlobalShape{}));

// A transposed value tensor [batch, heads, head_dim, keys], viewed as (head_dim, keys, heads, batch) so that a tile
// is a (head_dim, keys) box; keys is the padded row length. Its type is GlobalTensor's.
template <typename Element>
CUTE_HOST_DEVICE auto global_transposed_tensor(const void* data, GlobalShape shape) {
  const int64_t head = int64_t(get<0>(shape)) * get<1>(shape);  // head_dim * keys elements between heads
  return make_tensor(make_gmem_ptr(static_cast<Element const*>(data)), shape,
                     make_stride(int64_t(get<1>(shape)), _1{}, head, head * get<2>(shape)));
}

// kStages (rows, head_dim) tiles, 128-byte swizzled: conflict-free for wgmma reads and the TMA's native layout.
template <typename Element, int kRows, int kHeadDim, int kStages>
using SwizzledTiles = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{},
                                             Shape<Int<kRows>, Int<kHeadDim>, Int<kStages>>{}));

// The same bytes seen as (head_dim, rows, stages): the N-major B operand of a product that sums over the rows.
template <class Tiles, int kRows, int kHeadDim, int kStages>
using TransposedTiles = decltype(composition(
    Tiles{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kRows>, Int<kStages>>{}, Step<_2, _1, _3>{})));

// A producer warpgroup (TMA, and under a token mask the tile walk) and kConsumerWarpgroups of 64 rows each.
// setmaxnreg moves the producer's registers to the consumers; the sum over the CTA stays within what the launch
// gives it (per thread 65536 / kThreads, rounded down to a multiple of 8). The token walk needs more than 24
// producer registers to run without spills; configurations whose consumers can spare 8 give it 40.
template <int kConsumerWarpgroups_, int kProducerRegisters_ = 24>
struct WarpRoles {
  static constexpr int kConsumerWarpgroups = kConsumerWarpgroups_;
  static constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
  static constexpr int kThreads = kConsumerThreads + 128;
  static constexpr int kProducerRegisters = kProducerRegisters_;
  static constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8 * kThreads;
  static constexpr int kConsumerRegisters =
      kConsumerWarpgroups == 2 ? (kLaunchRegisters - 128 * kProducerRegisters) / kConsumerThreads / 8 * 8 : 160;
  static_assert(kProducerRegisters * 128 + kConsumerRegisters * kConsumerThreads <= kLaunchRegisters);
};

}  // namespace jax_flash::cuda_kernels::hopper
