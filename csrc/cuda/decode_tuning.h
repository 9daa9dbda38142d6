// Internal knobs of the CUDA decode plan, so that the standalone harness (tests/cuda/decode_harness.cu) can time
// every kernel shape and grid policy in one GPU run and name the best. Production calls plan_decode, which uses
// kDefaultDecodeTuning; nothing outside csrc/cuda and the harness sets these.
#pragma once

namespace jax_flash {

// The fp16/bf16 kernel shape for head dims 65..128 (other head dims and float32 always take their one shape).
// "Lanes" kernels stage lane-private 16-byte chunks that each lane reads back as its own mma operands; "rows"
// kernels stage whole key rows (padded, bank-conflict free) and read operands with ldmatrix, loaded by cp.async or,
// on sm_90, by one 1-D bulk copy per key row. "HeadsN" kernels are row kernels whose N warps each own one of N
// neighbouring kv heads over the same keys (instead of sharing one head). The last number is the per-warp pipeline
// depth in 16-key tiles.
enum class DecodeKernel : int {
  kLanes2, kLanes3, kRows2, kRows3, kBulk2, kBulk3, kBulk6, kHeads4Bulk2, kHeads8Bulk2, kHeads8Rows2, kCount
};

struct DecodeTuning {
  DecodeKernel kernel;
  // Grid order: kv heads fastest (the heads of one key range are read side by side: one contiguous run of
  // keys x heads in DRAM at a time) instead of splits fastest.
  bool heads_fastest;
  // The split count fills about this many waves of the GPU's block slots (more waves: shorter blocks, a smaller
  // partial last wave, more partials to combine).
  int waves;
  // Bulk-copy kernels only: each warp also prefetches into L2 the rows of the tiles this far beyond its pipeline, so
  // more bytes are in flight than its shared-memory stages hold (0: no prefetch).
  int prefetch_tiles;
  // The combine kernel is launched as a programmatic dependent (sm_90): its launch overlaps the split kernel's last
  // blocks, and it waits for their results on the GPU instead of between launches.
  bool overlap_combine;
};

// rows3, splits fastest, one wave, no prefetch, plain combine launch: the best score of the H200 sweep (commit 56ded63,
// docs/benchmarks.md) without the programmatic-dependent launch, which is unverified inside XLA's CUDA graphs.
constexpr DecodeTuning kDefaultDecodeTuning{DecodeKernel::kRows3, false, 1, 0, false};

inline const char* decode_kernel_name(DecodeKernel kernel) {
  constexpr const char* kNames[] = {"lanes2", "lanes3",      "rows2",       "rows3",      "bulk2",
                                    "bulk3",  "bulk6", "heads4bulk2", "heads8bulk2", "heads8rows2"};
  return kNames[static_cast<int>(kernel)];
}

}  // namespace jax_flash
