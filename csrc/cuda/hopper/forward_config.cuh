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

#include "tiles.cuh"

namespace jax_flash::cuda_kernels::hopper {

using namespace cute;

// Registers of the producer warpgroup (tiles.cuh). Two consumer warpgroups up to head dim 128 run without spills at
// 224, so the persistent loop and the token walk get 56, enough to read four chunk summaries per round trip
// (token_tiles.cuh); at 256 the consumers' output tile needs 240, leaving 24. Three consumer warpgroups get 160 each,
// leaving 32. Below 56 the walk reads one summary at a time and spills a few values to L1.
template <int kHeadDim, int kConsumerWarpgroups>
inline constexpr int kForwardProducerRegisters = kConsumerWarpgroups != 2 ? 32 : kHeadDim <= 128 ? 56 : 24;
template <int kProducerRegisters>
inline constexpr int kForwardWalkChunks = kProducerRegisters >= 56 ? 4 : 1;

// The shared value tiles seen as the B operand of P V, (head_dim, keys, stages): 16-bit tiles are stored (keys,
// head_dim) and read N-major; FP8 ones are stored transposed already.
template <bool kTransposed, class SmemLayoutV, int kBlockN, int kHeadDim, int kStages>
constexpr auto value_operand_layout() {
  if constexpr (kTransposed) {
    return SmemLayoutV{};
  } else {
    return TransposedTiles<SmemLayoutV, kBlockN, kHeadDim, kStages>{};
  }
}

// Element is the type of q, k and v; Output that of the output (the same, but bfloat16 for e4m3 inputs).
// kMaxLagLog2_: how far a row's running maximum may lag (online_softmax.cuh; 0: exact).
template <typename Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kStages_, int kMaxLagLog2_,
          typename Output_ = Element_>
struct ForwardConfig : WarpRoles<kBlockM_ / 64, kForwardProducerRegisters<kHeadDim_, kBlockM_ / 64>> {
  using Element = Element_;
  using Output = Output_;
  // 8-bit wgmma reads both operands from shared memory K-major only, so P V needs v with its keys contiguous: FP8
  // calls take v transposed (and its keys permuted, fp8_operand.cuh) in a workspace, [batch, heads_kv, head_dim,
  // keys rounded up to 32].
  static constexpr bool kFp8 = sizeof(Element) == 1;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kStages = kStages_;
  static constexpr int kMaxLagLog2 = kMaxLagLog2_;
  // FP8 probabilities are scaled to fill e4m3's range, which a lagging maximum would overflow.
  static_assert(!kFp8 || kMaxLagLog2 == 0);
  using Roles = WarpRoles<kBlockM_ / 64, kForwardProducerRegisters<kHeadDim_, kBlockM_ / 64>>;
  static constexpr int kWalkChunks = kForwardWalkChunks<Roles::kProducerRegisters>;
  using Roles::kConsumerWarpgroups;
  static constexpr int kProducerLanes = 32;  // one warp loads; each lane arrives on a key stage's "full" barrier
  static_assert(kHeadDim % 64 == 0, "128-byte swizzled rows need head_dim in multiples of 64 elements");
  static_assert(kBlockM % 64 == 0 && kBlockN % 16 == 0);

  using SmemLayoutQ = decltype(take<0, 2>(SwizzledTiles<Element, kBlockM, kHeadDim, 1>{}));
  using SmemLayoutK = SwizzledTiles<Element, kBlockN, kHeadDim, kStages>;
  using SmemLayoutV = SwizzledTiles<Element, kFp8 ? kHeadDim : kBlockN, kFp8 ? kBlockN : kHeadDim, kStages>;
  // For P @ V: (head_dim, keys, stages) as the B operand, N-major for 16-bit v, K-major for the transposed FP8 one.
  using SmemLayoutVt = decltype(value_operand_layout<kFp8, SmemLayoutV, kBlockN, kHeadDim, kStages>());
  static constexpr GMMA::Major kMajorV = kFp8 ? GMMA::Major::K : GMMA::Major::MN;

  // S = Q K^T with both operands in shared memory; O += P V with P from registers (the softmax output).
  using WarpgroupLayout = Layout<Shape<Int<kConsumerWarpgroups>, _1, _1>>;
  using MmaQK = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<Int<kBlockM>, Int<kBlockN>, Int<kHeadDim>>>(),
      WarpgroupLayout{}));
  using MmaPV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<Int<kBlockM>, Int<kHeadDim>, Int<kBlockN>>,
                           GMMA::Major::K, kMajorV>(),
      WarpgroupLayout{}));

  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GlobalTensor<Element>{}, SmemLayoutQ{}));
  using TmaKV = decltype(make_tma_copy(SM90_TMA_LOAD{}, GlobalTensor<Element>{}, take<0, 2>(SmemLayoutK{})));
  using TmaV = decltype(make_tma_copy(SM90_TMA_LOAD{}, GlobalTensor<Element>{}, take<0, 2>(SmemLayoutV{})));

  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kKVBytes = kBlockN * kHeadDim * sizeof(Element);

  // Where the shared memory has room (not at head dim 256), each consumer warpgroup stages its 64 output rows in
  // shared memory and one of its threads stores them with the TMA, which clips rows past seqlen_q and columns past
  // head_dim; the warpgroup goes on to its next work tile while the store drains. Otherwise the consumers store
  // their registers directly (accumulator_store.cuh).
  static constexpr uint32_t kOutputBytes = kConsumerWarpgroups * 64 * kHeadDim * sizeof(Output);
  // 3072: room for the barriers, tickets and staged key tokens beside the tiles.
  static constexpr int kSmemBudget = 227 * 1024 - 3072;
  // Two query buffers where they fit beside staged output: the producer then loads the next work tile's queries
  // (and its first keys) while the consumers still run this one's last Q K^T, instead of after it, so short work
  // tiles (short or causal sequences, packed documents) do not start by waiting for a load.
  static constexpr uint32_t kBytesBesideQ = 2 * kStages * kKVBytes + kOutputBytes;  // K and V ring, staged output
  static constexpr int kQBuffers = 2 * kQBytes + kBytesBesideQ <= kSmemBudget ? 2 : 1;
  static constexpr bool kStagedOutput = kQBuffers * kQBytes + kBytesBesideQ <= kSmemBudget;
  using SmemLayoutOutput = decltype(take<0, 2>(SwizzledTiles<Output, 64, kHeadDim, 1>{}));
  // One warpgroup's share of the P V product: the layout its accumulator fragment has, for the shared-memory copy.
  using MmaPVWarpgroup = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<kHeadDim>, Int<kBlockN>>, GMMA::Major::K,
                           kMajorV>()));
  using TmaOutput = decltype(make_tma_copy(SM90_TMA_STORE{}, GlobalTensor<Output>{}, SmemLayoutOutput{}));

  struct SharedStorage {
    alignas(1024) array_aligned<Element, kQBuffers * cosize_v<SmemLayoutQ>, 1024> q;
    alignas(1024) array_aligned<Element, cosize_v<SmemLayoutK>, 1024> k;
    alignas(1024) array_aligned<Element, cosize_v<SmemLayoutV>, 1024> v;
    alignas(1024) array_aligned<Output, kStagedOutput ? kConsumerWarpgroups * cosize_v<SmemLayoutOutput> : 1, 1024>
        output;
    uint64_t q_full[kQBuffers];
    uint64_t q_empty[kQBuffers];
    uint64_t k_full[kStages];
    uint64_t k_empty[kStages];
    uint64_t v_full[kStages];
    uint64_t v_empty[kStages];
    int tickets[kStages];  // what each stage holds (tile_tickets.cuh)
    int2 key_tokens[kStages][kBlockN];  // a partial tile's key (segment id, position), under a token mask
    int work[kQBuffers];   // the work tile of each query buffer (work_tiles.cuh)
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage);
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than one Hopper SM has");
};

}  // namespace jax_flash::cuda_kernels::hopper
