// Compile-time shape of one Hopper forward kernel: tile sizes, shared-memory layouts, the two warpgroup GEMMs and
// the TMA copies. One CTA owns kBlockM query rows of one (batch, head); a producer warpgroup streams key/value tiles
// of kBlockN rows through a kStages-deep ring, and kBlockM / 64 consumer warpgroups each own 64 of the query rows.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/copy_atom.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cutlass/numeric_types.h>

namespace jax_flash::cuda_kernels::hopper {

using namespace cute;

// Global tensors are [batch, seq, heads, head_dim]; the TMA views them as (seq, head_dim, heads, batch) so a tile is
// a (rows, head_dim) box at fixed (head, batch). Extents are int32 (the handlers bound them), strides int64.
using GlobalShape = Shape<int32_t, int32_t, int32_t, int32_t>;
using GlobalStride = Stride<int64_t, _1, int64_t, int64_t>;

template <typename Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kStages_>
struct ForwardConfig {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kStages = kStages_;
  static constexpr int kConsumerWarpgroups = kBlockM / 64;
  static constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
  static constexpr int kThreads = kConsumerThreads + 128;  // plus the producer warpgroup
  // setmaxnreg budgets: the producer only issues TMA, so the consumers take its registers. The sum over the CTA must
  // stay within the 64K-register file for one CTA per SM.
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters = kConsumerWarpgroups == 2 ? 240 : 160;
  static_assert(kProducerRegisters * 128 + kConsumerRegisters * kConsumerThreads <= 65536);
  static_assert(kHeadDim % 64 == 0, "128-byte swizzled rows need head_dim in multiples of 64 elements");
  static_assert(kBlockM % 64 == 0 && kBlockN % 16 == 0);

  // 128-byte swizzle: conflict-free for wgmma reads and the TMA's native layout.
  using SmemAtom = GMMA::Layout_K_SW128_Atom<Element>;
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutK = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>, Int<kStages>>{}));
  using SmemLayoutV = SmemLayoutK;
  // The same bytes as V, seen as (head_dim, keys): the N-major B operand of the P @ V product.
  using SmemLayoutVt = decltype(composition(
      SmemLayoutV{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockN>, Int<kStages>>{}, Step<_2, _1, _3>{})));

  // S = Q K^T with both operands in shared memory; O += P V with P from registers (the softmax output).
  using WarpgroupLayout = Layout<Shape<Int<kConsumerWarpgroups>, _1, _1>>;
  using MmaQK = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<Int<kBlockM>, Int<kBlockN>, Int<kHeadDim>>>(),
      WarpgroupLayout{}));
  using MmaPV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<Int<kBlockM>, Int<kHeadDim>, Int<kBlockN>>,
                           GMMA::Major::K, GMMA::Major::MN>(),
      WarpgroupLayout{}));

  using GlobalTensor = decltype(make_tensor(make_gmem_ptr(static_cast<Element const*>(nullptr)), GlobalShape{},
                                            GlobalStride{}));
  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GlobalTensor{}, SmemLayoutQ{}));
  using TmaKV = decltype(make_tma_copy(SM90_TMA_LOAD{}, GlobalTensor{}, take<0, 2>(SmemLayoutK{})));

  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kKVBytes = kBlockN * kHeadDim * sizeof(Element);

  struct SharedStorage {
    alignas(1024) array_aligned<Element, cosize_v<SmemLayoutQ>, 1024> q;
    alignas(1024) array_aligned<Element, cosize_v<SmemLayoutK>, 1024> k;
    alignas(1024) array_aligned<Element, cosize_v<SmemLayoutV>, 1024> v;
    uint64_t q_full;
    uint64_t k_full[kStages];
    uint64_t k_empty[kStages];
    uint64_t v_full[kStages];
    uint64_t v_empty[kStages];
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage);
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than one Hopper SM has");
};

}  // namespace jax_flash::cuda_kernels::hopper
