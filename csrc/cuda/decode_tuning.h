// Internal knobs of the CUDA decode plan, so that the standalone harness (tests/cuda/decode_harness.cu) can time
// each kernel shape and grid policy in one GPU run and name the best. Production calls plan_decode, which uses
// kDefaultDecodeTuning; nothing outside csrc/cuda and the harness sets these.
#pragma once

namespace jax_flash {

// The block shape of the fp16/bf16 rows kernel (decode_split_rows.cuh; float32 always takes its one shape): a per-warp
// pipeline 2 or 3 tiles of 16 keys deep in blocks of 4 warps (rows2, rows3: 2 blocks per SM on sm_90 at head dim
// 128); the wide blocks of the most warps whose tiles fit one block (8 warps 3 deep up to head dim 128, 6 warps 2
// deep at 256: one block per SM fills the GPU with fewer splits); and the narrow blocks of 2 warps 2 deep, for GPUs
// whose blocks may use too little shared memory for rows2 (sm_86 and sm_89 at head dims above 128: 99 KiB).
enum class DecodeKernel : int { kRows2, kRows3, kWide, kNarrow, kCount };

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
  // The splits of a (sequence, kv head, pass) run as one thread-block cluster (sm_90) and combine their partials
  // through each other's shared memory at the end, instead of through global memory and the combine kernel (which
  // remains for the float32 kernel, more than kMaxClusterSplits splits, and GPUs or grids where the clusters would
  // leave block slots empty).
  bool cluster_combine;
};

// rows3, splits fastest, one wave, the combine launched as a programmatic dependent: the best score of the H200 sweep
// of 2026-12-04 (docs/benchmarks.md). plan_decode swaps in the wide blocks where the key range must be split, and
// rows2 or the narrow blocks where rows3 does not fit; the combine runs in the split kernel's clusters wherever they
// can.
constexpr DecodeTuning kDefaultDecodeTuning{DecodeKernel::kRows3, false, 1, true, true};

inline const char* decode_kernel_name(DecodeKernel kernel) {
  constexpr const char* kNames[] = {"rows2", "rows3", "wide", "narrow"};
  return kNames[static_cast<int>(kernel)];
}

}  // namespace jax_flash
