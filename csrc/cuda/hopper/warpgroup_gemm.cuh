// Warpgroup GEMMs (wgmma) and the views of their float32 accumulators that the softmax needs.
#pragma once

#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>

namespace jax_flash::cuda_kernels::hopper {

using namespace cute;

// Issues C (+)= A B over every k-slice as one wgmma batch. kWait < 0 leaves the batch in flight, so the caller
// can overlap it with other work and wait later (warpgroup_wait<n>); C and a register A must not be touched until
// then. kZeroInit starts from C = 0 instead of reading C.
template <bool kZeroInit, int kWait, class TiledMma, class TensorA, class TensorB, class TensorC>
__device__ __forceinline__ void warpgroup_gemm(TiledMma& mma, TensorA const& a, TensorB const& b, TensorC& c) {
  // Shared-memory operands come as wgmma descriptors; anything else is a register fragment.
  constexpr bool kRegisterA = !is_same_v<typename TensorA::iterator, GMMA::DescriptorIterator>;
  if constexpr (kRegisterA) warpgroup_fence_operand(const_cast<TensorA&>(a));
  warpgroup_fence_operand(c);
  warpgroup_arrive();
  if constexpr (kZeroInit) mma.accumulate_ = GMMA::ScaleOut::Zero;
  CUTE_UNROLL
  for (int k = 0; k < size<2>(a); ++k) {
    gemm(mma, a(_, _, k), b(_, _, k), c);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  if constexpr (kWait >= 0) warpgroup_wait<kWait>();
  warpgroup_fence_operand(c);
  if constexpr (kRegisterA) warpgroup_fence_operand(const_cast<TensorA&>(a));
}

// The first thread of `thread`'s warpgroup, as a value ptxas knows to be warp-uniform (a shuffle from lane 0, as in
// CUTLASS's canonical_warp_group_idx). A wgmma's shared-memory operands (descriptors) depend on the thread only
// through its warpgroup: partitioned by this index, their descriptors can be built in uniform registers; from
// threadIdx.x, ptxas builds them in vector registers and moves them (R2UR) to uniform ones before every wgmma.
__device__ __forceinline__ int warpgroup_first_thread(int thread) {
  return __shfl_sync(0xffffffffu, thread / 128, 0) * 128;
}

// A wgmma float32 accumulator fragment is ((2 columns, 2 rows, N/8 column groups), MMA_M, MMA_N). As
// (rows, columns) each thread holds 2 * MMA_M rows, and the 4 threads of a quad share each row.
template <class Layout>
__device__ __forceinline__ constexpr auto accumulator_rows(Layout acc) {
  return make_layout(make_layout(get<0, 1>(acc), get<1>(acc)),
                     make_layout(get<0, 0>(acc), get<0, 2>(acc), get<2>(acc)));
}

// The register A operand of a 16-bit wgmma is ((2, 2, 2), MMA_M, MMA_K) per k16 slice: the accumulator of S with
// its column groups paired up, so P = softmax(S) feeds P V without leaving registers.
template <class Layout>
__device__ __forceinline__ constexpr auto accumulator_as_operand_a(Layout acc) {
  auto column_pairs = logical_divide(get<0, 2>(acc), Tile<_2>{});  // ((2, N/16))
  return make_layout(make_layout(get<0, 0>(acc), get<0, 1>(acc), get<0, 0>(column_pairs)), get<1>(acc),
                     coalesce(make_layout(get<0, 1>(column_pairs), get<2>(acc))));
}

// A float32 accumulator rounded to the 16-bit register operand of the next wgmma, with paired conversions
// (cvt.rn.bf16x2 / f16x2) over the whole fragment.
template <class Accumulator, class Operand>
__device__ __forceinline__ void convert_fragment(Accumulator const& accumulator, Operand& operand) {
  using Element = typename Operand::value_type;
  constexpr int kCount = decltype(size(accumulator))::value;
  static_assert(decltype(size(operand))::value == kCount);
  cutlass::NumericArrayConverter<Element, float, kCount> convert;
  *reinterpret_cast<cutlass::Array<Element, kCount>*>(operand.data()) =
      convert(*reinterpret_cast<cutlass::Array<float, kCount> const*>(accumulator.data()));
}

}  // namespace jax_flash::cuda_kernels::hopper
