// Split-KV decode (flash-decoding): planning and launch. The kernels are in decode_split_rows.cuh (fp16/bf16, tensor
// cores; its block shape is DecodeTuning::kernel) and decode_split_simt.cuh (float32, CUDA cores); both are bound by
// memory bandwidth, so the plan's job is to give every SM enough blocks:
//
// * A block owns (split, kv head, pass of packed rows, sequence). Packed rows are all query heads of the kv head at
//   every new position, so each K/V row is read once for all of them.
// * When batch x kv_heads x passes cannot fill the GPU in whole waves, the key range is split across blocks; the
//   split count comes from the SM count, the kernel's blocks per SM and the cache capacity. Each split writes a
//   normalised partial output and its lse, and a combine kernel merges them; on sm_90 the fp16/bf16 kernel's splits
//   of one item run as a thread-block cluster instead and merge through shared memory, with no second kernel. With
//   one split the output is direct.
#include <algorithm>
#include <atomic>
#include <cstdint>

#include "decode_combine.cuh"
#include "decode_cuda.h"
#include "decode_split_rows.cuh"
#include "decode_split_simt.cuh"
#include "device_attribute.h"
#include "kernel_choice.h"

namespace jax_flash {
namespace cuda_kernels::decode {
namespace {

constexpr int64_t kMinKeysPerSplit = 256;  // below this the pipeline fill and the combine outweigh the parallelism
// Fewer splits are preferred while their wave efficiency is within this factor of the best split count's.
constexpr double kWaveTolerance = 0.95;
constexpr int kMaxDevices = 64;

cudaError_t current_device(int* device) { return cudaGetDevice(device); }

cudaError_t sm_count(int* count) { return device_attribute<cudaDevAttrMultiProcessorCount>(count); }

// A split kernel instance with what planning and launching need to know about it. kClusterable: the kernel can
// combine its splits within a cluster (LaunchShape::cluster_combine).
template <typename ElementT, int kRowsPerPass, int kThreadsPerBlock, size_t kSharedBytes, bool kClusterable,
          typename Kernel>
struct Instance {
  using Element = ElementT;
  static constexpr int kRows = kRowsPerPass;
  static constexpr int kThreads = kThreadsPerBlock;
  static constexpr size_t kShared = kSharedBytes;

  // Resident blocks per SM (once per device: the first call also lifts the kernel's dynamic shared memory limit,
  // which every launch on that device needs).
  static cudaError_t blocks_per_sm(int* blocks) {
    static std::atomic<int> cached[kMaxDevices] = {};
    int device = 0;
    if (cudaError_t status = current_device(&device); status != cudaSuccess) return status;
    if (device < kMaxDevices && (*blocks = cached[device].load(std::memory_order_relaxed)) > 0) return cudaSuccess;
    if (cudaError_t status = cudaFuncSetAttribute(Kernel::function, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                  static_cast<int>(kShared));
        status != cudaSuccess)
      return status;
    if (cudaError_t status = cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, Kernel::function, kThreads, kShared);
        status != cudaSuccess)
      return status;
    *blocks = std::max(*blocks, 1);
    if (device < kMaxDevices) cached[device].store(*blocks, std::memory_order_relaxed);
    return cudaSuccess;
  }

  static int64_t passes(const DecodeParams& p) { return (p.q_len * p.group() + kRows - 1) / kRows; }

  // Blocks per (split, sequence): one per pass of each kv head.
  static int64_t head_passes(const DecodeParams& p) { return p.cache.heads_kv * passes(p); }

  // The launch configuration; with `clustered`, each item's `splits` blocks form one cluster (along the grid
  // dimension of the splits, so a block's cluster rank is its split). `attribute` is the cluster's storage.
  static cudaLaunchConfig_t config(const DecodeParams& p, int64_t splits, bool heads_fastest, bool clustered,
                                   cudaLaunchAttribute* attribute, cudaStream_t stream) {
    const unsigned split_blocks = static_cast<unsigned>(splits);
    const unsigned head_blocks = static_cast<unsigned>(head_passes(p));
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(heads_fastest ? head_blocks : split_blocks, heads_fastest ? split_blocks : head_blocks,
                          static_cast<unsigned>(p.batch));
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = kShared;
    config.stream = stream;
    attribute->id = cudaLaunchAttributeClusterDimension;
    attribute->val.clusterDim.x = heads_fastest ? 1 : split_blocks;
    attribute->val.clusterDim.y = heads_fastest ? split_blocks : 1;
    attribute->val.clusterDim.z = 1;
    config.attrs = attribute;
    config.numAttrs = clustered ? 1 : 0;
    return config;
  }

  // Whether clusters of `splits` blocks keep as many blocks resident as plain blocks would (`resident` of them), on
  // this device and from this build: the code must be sm_90's (an older architecture's PTX compiled on the fly has
  // no cluster instructions). Asked once per device and split count.
  static cudaError_t clusters_fit(const DecodeParams& p, int64_t splits, bool heads_fastest, int64_t resident,
                                  bool* fit) {
    static std::atomic<int> cached[kMaxDevices][kMaxClusterSplits + 1] = {};  // 0 unknown, else 1 + clusters
    *fit = false;
    if (splits < 2 || splits > kMaxClusterSplits || !kClusterable) return cudaSuccess;
    int device = 0;
    if (cudaError_t status = current_device(&device); status != cudaSuccess) return status;
    int known = device < kMaxDevices ? cached[device][splits].load(std::memory_order_relaxed) : 0;
    if (known == 0) {
      cudaFuncAttributes attributes{};
      if (cudaError_t status = cudaFuncGetAttributes(&attributes, Kernel::function); status != cudaSuccess)
        return status;
      int clusters = 0;
      if (attributes.ptxVersion >= 90) {
        if (cudaError_t status =
                cudaFuncSetAttribute(Kernel::function, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
            status != cudaSuccess)
          return status;
        cudaLaunchAttribute attribute{};
        const cudaLaunchConfig_t launch = config(p, splits, heads_fastest, true, &attribute, nullptr);
        if (cudaError_t status = cudaOccupancyMaxActiveClusters(&clusters, Kernel::function, &launch);
            status != cudaSuccess)
          return status;
      }
      known = 1 + clusters;
      if (device < kMaxDevices) cached[device][splits].store(known, std::memory_order_relaxed);
    }
    *fit = int64_t{known - 1} * splits >= resident;
    return cudaSuccess;
  }

  static cudaError_t launch(const DecodeParams& p, int64_t splits, const DecodeTuning& tuning, Partials parts,
                            cudaStream_t stream) {
    const LaunchShape shape{static_cast<int>(passes(p)), tuning.heads_fastest, tuning.cluster_combine};
    cudaLaunchAttribute attribute{};
    const cudaLaunchConfig_t launch =
        config(p, splits, tuning.heads_fastest, tuning.cluster_combine, &attribute, stream);
    return cudaLaunchKernelEx(&launch, Kernel::function, p, shape, parts);
  }
};

template <typename Element, int kWidth, int kWarps, int kStages>
struct RowsFunction {
  static constexpr auto function = decode_rows_kernel<Element, kWidth, kWarps, kStages>;
};

template <typename Element, int kWidth, int kWarps, int kStages>
using Rows = Instance<Element, kMmaRows, kWarps * 32, RowsKernel<Element, kWidth, kWarps, kStages>::kSharedBytes, true,
                      RowsFunction<Element, kWidth, kWarps, kStages>>;

template <int kLanes, int kChunks, int kRows>
struct SimtFunction {
  static constexpr auto function = decode_simt_kernel<kLanes, kChunks, kRows>;
};

template <int kLanes, int kChunks, int kRows>
using Simt = Instance<float, kRows, kSimtThreads, 0, false, SimtFunction<kLanes, kChunks, kRows>>;

// Calls visit(Instance{}) with the rows kernel of `kernel`'s shape at kWidth, the head dims up to which it stages
// rows (64, 128 or 256; narrower head dims zero-fill the columns past them). The shapes keep 2 or 3 tiles per warp
// (22-202 KiB per block); the wide one is the most warps per SM whose tiles fit in one block (8 up to head dim 128,
// 6 at 256).
template <typename Element, int kWidth, typename Visitor>
cudaError_t visit_rows(DecodeKernel kernel, Visitor&& visit) {
  constexpr int kWideWarps = kWidth <= 128 ? 8 : 6, kWideStages = kWidth <= 128 ? 3 : 2;
  switch (kernel) {
    case DecodeKernel::kRows2: return visit(Rows<Element, kWidth, 4, 2>{});
    case DecodeKernel::kRows3: return visit(Rows<Element, kWidth, 4, 3>{});
    case DecodeKernel::kWide: return visit(Rows<Element, kWidth, kWideWarps, kWideStages>{});
    case DecodeKernel::kNarrow: return visit(Rows<Element, kWidth, 2, 2>{});
    case DecodeKernel::kCount: break;
  }
  return cudaErrorInvalidValue;
}

template <typename Element, typename Visitor>
cudaError_t visit_tensor_core(int64_t d, DecodeKernel kernel, Visitor&& visit) {
  if (d <= 64) return visit_rows<Element, 64>(kernel, visit);
  if (d <= 128) return visit_rows<Element, 128>(kernel, visit);
  if (d <= 256) return visit_rows<Element, 256>(kernel, visit);
  return cudaErrorInvalidValue;
}

// The float32 kernel: kLanes lanes of kChunks 16-byte chunks cover a key row (the fewest lanes, at least 8, that do),
// and 4 or 8 packed rows per pass.
template <int kLanes, int kChunks, typename Visitor>
cudaError_t visit_simt_rows(const DecodeParams& p, Visitor&& visit) {
  if (p.q_len * p.group() <= 4) return visit(Simt<kLanes, kChunks, 4>{});
  return visit(Simt<kLanes, kChunks, 8>{});
}

template <typename Visitor>
cudaError_t visit_instance(const DecodeParams& p, DecodeKernel kernel, Visitor&& visit) {
  const int64_t d = p.cache.head_dim;
  switch (p.dtype) {
    case DType::kFloat16: return visit_tensor_core<__half>(d, kernel, visit);
    case DType::kBFloat16: return visit_tensor_core<__nv_bfloat16>(d, kernel, visit);
    case DType::kFloat32:
      if (d <= 32) return visit_simt_rows<8, 1>(p, visit);
      if (d <= 64) return visit_simt_rows<16, 1>(p, visit);
      if (d <= 128) return visit_simt_rows<32, 1>(p, visit);
      if (d <= 256) return visit_simt_rows<32, 2>(p, visit);
      return cudaErrorInvalidValue;
  }
  return cudaErrorInvalidValue;
}

// The split count whose blocks fill the GPU's block slots in the most nearly whole waves (blocks of one launch do
// equal work, so a partial last wave costs a whole one), preferring fewer splits when nearly as good.
int64_t choose_splits(int64_t items, int64_t slots, int64_t max_splits) {
  auto efficiency = [&](int64_t splits) {
    const int64_t blocks = items * splits, waves = (blocks + slots - 1) / slots;
    return static_cast<double>(blocks) / static_cast<double>(waves * slots);
  };
  double best = 0.;
  for (int64_t s = 1; s <= max_splits; ++s) best = std::max(best, efficiency(s));
  for (int64_t s = 1; s <= max_splits; ++s)
    if (efficiency(s) >= kWaveTolerance * best) return s;
  return 1;
}

bool aligned_16(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer) % 16 == 0; }

}  // namespace
}  // namespace cuda_kernels::decode

using namespace cuda_kernels::decode;

cudaError_t plan_decode(const DecodeParams& p, size_t workspace_limit, DecodePlan* plan) {
  int shared_limit = 0;
  if (cudaError_t status = cuda_kernels::block_shared_memory_limit(&shared_limit); status != cudaSuccess)
    return status;
  auto fits = [&](DecodeKernel kernel, bool* fit) {
    size_t needed = 0;
    const cudaError_t status = visit_instance(p, kernel, [&](auto instance) {
      needed = decltype(instance)::kShared;
      return cudaSuccess;
    });
    *fit = needed <= static_cast<size_t>(shared_limit);
    return status;
  };
  // rows3 needs more shared memory per block than some GPUs allow (106 KiB at head dim 128: sm_86 and sm_89 stop at
  // 99 KiB; 202 KiB at 256: sm_80 stops at 163): there the shallower rows2 runs, or the 2-warp narrow blocks where
  // even rows2 does not fit. Programmatic dependent launch exists from sm_90 on.
  DecodeTuning tuning = kDefaultDecodeTuning;
  int major = 0;
  if (cudaError_t status = cuda_kernels::device_attribute<cudaDevAttrComputeCapabilityMajor>(&major);
      status != cudaSuccess)
    return status;
  tuning.overlap_combine = tuning.overlap_combine && major >= 9;
  // Clusters exist from sm_90 on; JAX_FLASH_KERNELS=sm80 keeps the combine kernel, so it stays testable on Hopper.
  tuning.cluster_combine = tuning.cluster_combine && major >= 9 && cuda_kernels::hopper_kernels_allowed();
  for (DecodeKernel kernel : {tuning.kernel, DecodeKernel::kRows2, DecodeKernel::kNarrow}) {  // narrow: <= 70 KiB
    tuning.kernel = kernel;
    bool fit = false;
    if (cudaError_t status = fits(kernel, &fit); status != cudaSuccess) return status;
    if (fit) break;
  }
  if (cudaError_t status = plan_decode_tuned(p, tuning, workspace_limit, plan);
      status != cudaSuccess || plan->splits == 1)
    return status;
  // Where rows3 must split the key range, the wide blocks (one or two per SM) fill the GPU with fewer splits, or with
  // none, and read faster on the H200: 1-4% at head dim 128 (8 x 4k, 8 x 32k, 1 x 131k), 6% and 14% at head dim 64
  // (64 x 8k, 128 x 2k, where they need no split). Where rows3 fills the GPU unsplit, its blocks of 4 warps read 2-5%
  // faster (64 x 8k, 128 x 2k at head dim 128).
  if (tuning.kernel != DecodeKernel::kRows3) return cudaSuccess;
  bool fit = false;
  if (cudaError_t status = fits(DecodeKernel::kWide, &fit); status != cudaSuccess || !fit) return status;
  tuning.kernel = DecodeKernel::kWide;
  return plan_decode_tuned(p, tuning, workspace_limit, plan);
}

cudaError_t plan_decode_tuned(const DecodeParams& p, const DecodeTuning& tuning, size_t workspace_limit,
                              DecodePlan* plan) {
  if (tuning.waves < 1) return cudaErrorInvalidValue;
  plan->tuning = tuning;
  return visit_instance(p, tuning.kernel, [&](auto instance) {
    using Kernel = decltype(instance);
    int sms = 0, per_sm = 0;
    if (cudaError_t status = sm_count(&sms); status != cudaSuccess) return status;
    if (cudaError_t status = Kernel::blocks_per_sm(&per_sm); status != cudaSuccess) return status;
    const int64_t items = std::max<int64_t>(p.batch * Kernel::head_passes(p), 1);
    const int64_t useful = (p.cache.capacity() + kMinKeysPerSplit - 1) / kMinKeysPerSplit;
    const int64_t slots = int64_t{sms} * per_sm * tuning.waves;
    const int64_t rows_out = p.batch * p.q_len * p.heads_q;
    const size_t split_bytes = sizeof(float) * static_cast<size_t>(rows_out * (p.cache.head_dim + 1));
    const int64_t fitting =
        static_cast<int64_t>(std::min<size_t>(workspace_limit / std::max<size_t>(split_bytes, 1), kMaxSplits));
    const int64_t most_useful = std::clamp<int64_t>(useful, 1, kMaxSplits);
    plan->splits = choose_splits(items, slots, std::min(most_useful, std::max<int64_t>(fitting, 1)));
    // Clusters need no workspace, so their split count is the one the workspace would not cap; they are used when
    // that count fits a cluster and the clusters fill as many block slots as plain blocks would.
    bool clustered = false;
    if (tuning.cluster_combine) {
      const int64_t preferred = fitting >= most_useful ? plan->splits : choose_splits(items, slots, most_useful);
      if (preferred <= kMaxClusterSplits) {
        if (cudaError_t status = Kernel::clusters_fit(p, preferred, tuning.heads_fastest,
                                                      std::min(items * preferred, slots), &clustered);
            status != cudaSuccess)
          return status;
      }
      if (clustered) plan->splits = preferred;
    }
    plan->tuning.cluster_combine = clustered;
    plan->workspace_bytes =
        plan->splits == 1 || plan->tuning.cluster_combine ? 0 : split_bytes * static_cast<size_t>(plan->splits);
    return cudaSuccess;
  });
}

cudaError_t launch_decode(const DecodeParams& p, const DecodePlan& plan, void* workspace, cudaStream_t stream) {
  // Backstops: the FFI handlers validate first. Positions are 32-bit in the kernels; a 16-key tile must not straddle
  // a page.
  const bool supported = p.cache.head_dim % 8 == 0 && p.cache.head_dim <= 256 && p.heads_q % p.cache.heads_kv == 0 &&
                         p.batch <= 65535 && p.cache.capacity() < (int64_t{1} << 30) &&
                         (p.cache.pages_per_seq == 1 || p.cache.page_size % kKeyAlign == 0) && plan.splits >= 1 &&
                         plan.splits <= (plan.tuning.cluster_combine ? kMaxClusterSplits : kMaxSplits);
  const bool aligned = aligned_16(p.q) && aligned_16(p.k) && aligned_16(p.v);
  const bool partials = plan.splits > 1 && !plan.tuning.cluster_combine;
  if (!supported || !aligned || (partials && workspace == nullptr)) return cudaErrorInvalidValue;
  const int64_t rows_out = p.batch * p.q_len * p.heads_q;
  Partials parts{static_cast<float*>(workspace), nullptr};
  if (workspace != nullptr) parts.lse = parts.o + plan.splits * rows_out * p.cache.head_dim;
  return visit_instance(p, plan.tuning.kernel, [&](auto instance) {
    using Kernel = decltype(instance);
    if (Kernel::head_passes(p) > 65535) return cudaErrorInvalidValue;  // grid y
    int per_sm = 0;
    if (cudaError_t status = Kernel::blocks_per_sm(&per_sm); status != cudaSuccess) return status;
    // A cluster plan must come from plan_decode_tuned's check on this device and for this kernel.
    bool fit = !plan.tuning.cluster_combine;
    if (!fit) {
      if (cudaError_t status = Kernel::clusters_fit(p, plan.splits, plan.tuning.heads_fastest, 1, &fit);
          status != cudaSuccess)
        return status;
    }
    if (!fit) return cudaErrorInvalidValue;
    if (cudaError_t status = Kernel::launch(p, plan.splits, plan.tuning, parts, stream);
        status != cudaSuccess || !partials)
      return status;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(static_cast<unsigned>(rows_out));
    config.blockDim = dim3(kCombineThreads);
    config.stream = stream;
    cudaLaunchAttribute overlap{};
    overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    overlap.val.programmaticStreamSerializationAllowed = 1;
    config.attrs = &overlap;
    // XLA's command buffers capture the stream into a CUDA graph: there the combine follows the split kernel plainly.
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaError_t status = cudaStreamIsCapturing(stream, &capture); status != cudaSuccess) return status;
    config.numAttrs = plan.tuning.overlap_combine && capture == cudaStreamCaptureStatusNone ? 1 : 0;
    return cudaLaunchKernelEx(&config, decode_combine_kernel<typename Kernel::Element>, p,
                              static_cast<int>(plan.splits), parts);
  });
}

}  // namespace jax_flash
