// Internal knobs of the CUDA decode plan, so that the standalone harness (tests/cuda/decode_harness.cu) can time
// each kernel shape and grid policy in one GPU run and name the best. Production calls plan_decode, which uses
// kDefaultDecodeTuning; nothing outside csrc/cuda and the harness sets these.
#pragma once

namespace jax_flash {

// The fp16/bf16 kernel for head dims 65..128 (other head dims and float32 always take their one shape): the rows
// kernel (decode_split_rows.cuh) with a per-warp pipeline 2 or 3 tiles of 16 keys deep. The two stay side by side
// because the better depth is a trade of bytes in flight against shared memory (blocks per SM) that may fall
// differently on another GPU.
enum class DecodeKernel : int { kRows2, kRows3, kCount };

struct DecodeTuning {
  DecodeKernel kernel;
  // Grid order: kv heads fastest (the heads of one key range are read side by side: one contiguous run of
  // keys x heads in DRAM at a time) instead of splits fastest.
  bool heads_fastest;
  // The split count fills about this many waves of the GPU's block slots (more waves: shorter blocks, a smaller
  // partial last wave, more partials to combine).
  int waves;
  // The combine kernel is launched as a programmatic dependent (sm_90): its launch overlaps the split kernel's last
  // blocks, and it waits for their results on the GPU instead of between launches.
  bool overlap_combine;
};

// rows3, splits fastest, one wave, plain combine launch: the best score of the H200 sweep (commit 56ded63,
// docs/benchmarks.md) without the programmatic-dependent launch, which is unverified inside XLA's CUDA graphs.
constexpr DecodeTuning kDefaultDecodeTuning{DecodeKernel::kRows3, false, 1, false};

inline const char* decode_kernel_name(DecodeKernel kernel) {
  constexpr const char* kNames[] = {"rows2", "rows3"};
  return kNames[static_cast<int>(kernel)];
}

}  // namespace jax_flash
