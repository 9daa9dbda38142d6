// Compile-time shapes of the two Hopper backward kernels. Both keep one operand pair resident in shared memory and
// stream the other pair through a TMA ring, like the forward:
//   key-gradient kernel:   resident K, V (kBlockN keys per CTA, 64 per consumer warpgroup); streams Q, dO (and the
//                          per-query lse and delta) in tiles of kBlockM queries; accumulates dK and dV.
//   query-gradient kernel: resident Q, dO (kBlockM queries per CTA); streams K, V in tiles of kBlockN keys;
//                          accumulates dQ.
// No atomics: each gradient is owned by one CTA, so the result is bitwise deterministic.
#pragma once

#include <cstdint>

#include "forward_config.cuh"
#include "query_gradient_sum.cuh"

namespace jax_flash::cuda_kernels::hopper {

// lse and delta for the key-gradient kernel: float32 (padded seqlen_q, heads_q, batch), contiguous in the query.
using RowStatsShape = Shape<int32_t, int32_t, int32_t>;
using RowStatsStride = Stride<_1, int64_t, int64_t>;

// kResident rows per CTA (64 per consumer warpgroup) against kStreamed rows per ring stage.
template <typename Element_, int kHeadDim_, int kResident_, int kStreamed_, int kStages_>
struct BackwardConfig : WarpRoles<kResident_ / 64> {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kResident = kResident_;
  static constexpr int kStreamed = kStreamed_;
  static constexpr int kStages = kStages_;
  using Roles = WarpRoles<kResident_ / 64>;
  using Roles::kConsumerWarpgroups;
  static_assert(kHeadDim % 64 == 0 && kResident % 64 == 0 && kStreamed % 16 == 0);

  using ResidentLayout = SwizzledTiles<Element, kResident, kHeadDim, 1>;
  using StreamedLayout = SwizzledTiles<Element, kStreamed, kHeadDim, kStages>;
  using StreamedTransposed = TransposedTiles<StreamedLayout, kStreamed, kHeadDim, kStages>;

  using WarpgroupLayout = Layout<Shape<Int<kConsumerWarpgroups>, _1, _1>>;
  // resident x streamed^T, both from shared memory: the scores and dP (or their transposes).
  using MmaScores = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<Int<kResident>, Int<kStreamed>, Int<kHeadDim>>>(),
      WarpgroupLayout{}));
  // (registers) x streamed: P^T dO, dS^T Q, or dS K.
  using MmaGradient = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<Int<kResident>, Int<kHeadDim>, Int<kStreamed>>,
                           GMMA::Major::K, GMMA::Major::MN>(),
      WarpgroupLayout{}));

  using TmaResident =
      decltype(make_tma_copy(SM90_TMA_LOAD{}, GlobalTensor<Element>{}, take<0, 2>(ResidentLayout{})));
  using TmaStreamed =
      decltype(make_tma_copy(SM90_TMA_LOAD{}, GlobalTensor<Element>{}, take<0, 2>(StreamedLayout{})));
  using StatsTensor = decltype(make_tensor(make_gmem_ptr(static_cast<float const*>(nullptr)), RowStatsShape{},
                                           RowStatsStride{}));
  using StatsLayout = Layout<Shape<Int<kStreamed>>>;
  using TmaStats = decltype(make_tma_copy(SM90_TMA_LOAD{}, StatsTensor{}, StatsLayout{}));

  static constexpr uint32_t kResidentBytes = kResident * kHeadDim * sizeof(Element);
  static constexpr uint32_t kStreamedBytes = kStreamed * kHeadDim * sizeof(Element);
  static constexpr uint32_t kStatsBytes = kStreamed * sizeof(float);

  struct SharedStorage {
    alignas(1024) array_aligned<Element, cosize_v<ResidentLayout>, 1024> resident_a;  // K or Q
    alignas(1024) array_aligned<Element, cosize_v<ResidentLayout>, 1024> resident_b;  // V or dO
    alignas(1024) array_aligned<Element, cosize_v<StreamedLayout>, 1024> streamed_a;  // Q or K
    alignas(1024) array_aligned<Element, cosize_v<StreamedLayout>, 1024> streamed_b;  // dO or V
    alignas(128) float lse[kStages][kStreamed];    // key-gradient kernel only
    alignas(128) float delta[kStages][kStreamed];
    uint64_t resident_full;
    uint64_t full[kStages];
    uint64_t empty[kStages];
    int tickets[kStages];       // what each stage holds (tile_tickets.cuh)
    int head_offsets[kStages];  // key-major: which query head of the KV group the stage's queries belong to
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage);
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than one Hopper SM has");
};

// The key-major configuration extended for the fused backward (role kFused): each streamed tile's
// dQ = dS K (queries x head_dim, summed over the CTA's keys) is added into a float32 sum (query_gradient_sum.cuh).
// dS leaves registers through shared memory, in two buffers by tile parity, because this product needs it with
// queries as rows; the two consumer warpgroups then each compute half of the head dim's columns, write them to a
// shared block, and a producer-side warp adds the block to the sum.
template <class Base>
struct FusedBackwardConfig : Base {
  using Element = typename Base::Element;
  using Base::kConsumerWarpgroups;
  using Base::kHeadDim;
  using Base::kResident;
  using Base::kStreamed;
  static_assert(kStreamed == 64 && kConsumerWarpgroups == 2, "dS buffers are one 128-byte swizzle atom of queries");
  static_assert(kStreamed == kSumTileRows, "one streamed tile is one block of the dQ sum");

  // (queries, keys, buffer), queries contiguous: the MN-major A operand of dQ = dS K.
  using ScoreGradientLayout =
      decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<Element>{}, Shape<Int<kStreamed>, Int<kResident>, _2>{}));
  // Bytes from one dS buffer to the next: a multiple of the 1024-byte swizzle span, so a thread's swizzled address
  // in the second buffer is its address in the first plus this.
  static constexpr uint32_t kScoreGradientBufferBytes = kStreamed * kResident * sizeof(Element);
  static_assert(ScoreGradientLayout{}.layout_b()(0, 0, 1) * sizeof(Element) == kScoreGradientBufferBytes &&
                kScoreGradientBufferBytes % 1024 == 0);
  // The same bytes as (keys, queries, buffer): where the key-major accumulator of dS^T is written.
  using ScoreGradientTransposed = TransposedTiles<ScoreGradientLayout, kStreamed, kResident, 2>;
  // K as (head_dim, keys): the MN-major B operand.
  using ResidentTransposed = TransposedTiles<typename Base::ResidentLayout, kResident, kHeadDim, 1>;
  using MmaQueries = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float,
                           Shape<Int<kStreamed>, Int<kHeadDim / kConsumerWarpgroups>, Int<kResident>>,
                           GMMA::Major::MN, GMMA::Major::MN>(),
      Layout<Shape<_1, Int<kConsumerWarpgroups>, _1>>{}));

  // dS^T leaves the consumers' registers by stmatrix, four per thread and buffer, kScoreGradientStoreStep bytes
  // apart along the queries before the swizzle.
  using ScoreGradientCopy =
      decltype(make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, typename Base::MmaScores{}));
  static constexpr uint32_t kScoreGradientStoreStep = 16 * sizeof(Element);

  struct SharedStorage : Base::SharedStorage {
    alignas(1024) array_aligned<Element, cosize_v<ScoreGradientLayout>, 1024> score_gradients;
    alignas(128) float query_gradient[kStreamed][kHeadDim + kSumRowPad];  // one tile's dQ, for the bulk add
    uint64_t query_gradient_full;   // the consumers wrote the block (and its target)
    uint64_t query_gradient_empty;  // the bulk add has read it
    int64_t query_gradient_target;  // the block's offset in the sum, in floats; -1: no more blocks
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage);
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than one Hopper SM has");
};

// Where thread `thread` (of the consumer warpgroups) stores its dS^T: ((8 values, 4 stores), 1, 1, buffer), the
// stores' first elements being its row addresses. The fused kernel computes one address from it and derives the rest
// (backward_kernel.cuh); tests/cuda/score_gradient_stores.cu checks that derivation for every thread on the host.
template <class Config>
CUTE_HOST_DEVICE auto score_gradient_targets(int thread, typename Config::Element* buffers) {
  Tensor all = make_tensor(make_smem_ptr(buffers), typename Config::ScoreGradientTransposed{});
  return typename Config::ScoreGradientCopy{}.get_thread_slice(thread).partition_D(all);
}

}  // namespace jax_flash::cuda_kernels::hopper
