// Split-KV decode (flash-decoding) on CUDA cores. Decoding reads the whole cache for a handful of query rows, so it
// is bound by memory bandwidth; the kernel's job is to keep every SM streaming K/V with 16-byte loads:
//
// * One block owns (split, kv head, pass of packed rows, sequence). Packed rows are all query heads of the kv head at
//   every new position (row = i * group + g), up to kRows per pass, so each K/V row is read once for all of them.
// * When batch x kv_heads cannot fill the GPU, the key range is split across blocks (the split count comes from the
//   SM count and the cache capacity); each split writes a normalised partial output and its lse, and a combine
//   kernel merges them. With a single split the kernel writes the output directly.
// * Inside a block, a "slot" of kLanes lanes holds one key row (each lane kChunks 16-byte chunks), computes the
//   logits of all packed rows with a butterfly reduction over its lanes, and keeps its own online softmax, so slots
//   never wait for each other; the slots' states are merged once, in shared memory, at the end of the split.
// * Keys past a sequence's length, or outside every row's window, are never loaded.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>

#include "../attention_mask.h"
#include "decode_cuda.h"
#include "decode_elements.cuh"

namespace jax_flash {
namespace cuda_kernels::decode {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kUnroll = 2;            // keys per slot loaded before any is used, for memory-level parallelism
constexpr int64_t kBlocksPerSm = 4;   // about what fits per SM at the kernels' register use: one full wave
constexpr int64_t kMinKeysPerSplit = 128;
constexpr int64_t kMaxSplits = 128;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

struct Partials {
  float* o;    // [splits, rows_out, head_dim], each split normalised by its own sum
  float* lse;  // [splits, rows_out], base-2
};

// Element offset of key j of sequence b, kv head h. 32-bit division: positions are far below 2^31, and the 64-bit
// one costs several times more per key.
__device__ __forceinline__ int64_t key_offset(const PagedCache& c, int64_t b, int j, int64_t h) {
  const int page_size = static_cast<int>(c.page_size);
  int64_t id = c.page_table[b * c.pages_per_seq + j / page_size];
  id = id < 0 ? 0 : (id >= c.num_pages ? c.num_pages - 1 : id);
  return ((id * c.page_size + j % page_size) * c.heads_kv + h) * c.head_dim;
}

// The explicit minimum of one block per SM stops ptxas (sm_80) from capping registers at 128 and spilling.
template <typename Element, int kLanes, int kChunks, int kRows>
__global__ void __launch_bounds__(kThreads, 1) decode_split_kernel(DecodeParams p, int passes, Partials parts) {
  constexpr int kElems = Chunk<Element>::kElems;
  constexpr int kSlots = kThreads / kLanes;
  constexpr int kWidth = kLanes * kChunks * kElems;  // columns covered by a slot, >= head_dim

  const int split = blockIdx.x, splits = gridDim.x;
  const int64_t hk = blockIdx.y / passes, b = blockIdx.z;
  const int row0 = (blockIdx.y % passes) * kRows;
  const int group = static_cast<int>(p.group()), rows_total = static_cast<int>(p.q_len) * group;
  const int rows = min(kRows, rows_total - row0);
  const int64_t d = p.cache.head_dim;
  const int lane = threadIdx.x % 32, sub = lane % kLanes, slot = static_cast<int>(threadIdx.x) / kLanes;

  // The keys any row of this pass may see, and this split's share.
  const int length = static_cast<int>(p.length(b));
  const int first_position = length - static_cast<int>(p.q_len);
  const int lowest = first_position + row0 / group, highest = first_position + (row0 + rows - 1) / group;
  const int begin = static_cast<int>(first_visible_key(p.mask, max(lowest, 0)));
  const int end = min(highest + 1, length);
  const int chunk = (max(end - begin, 0) + splits - 1) / splits;
  const int key_begin = begin + split * chunk, key_end = min(end, key_begin + chunk);

  // Rows' queries (pre-scaled), positions and output indices; rows past `rows` compute on zeros and are dropped.
  float q[kRows][kChunks][kElems];
  int position[kRows];
  int64_t out_row[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int row = row0 + min(r, rows - 1);
    position[r] = first_position + row / group;
    out_row[r] = (b * p.q_len + row / group) * p.heads_q + hk * group + row % group;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int64_t col = (c * kLanes + sub) * kElems;
      float values[kElems] = {};
      if (r < rows && col < d)
        to_floats<Element>(load_chunk(static_cast<const Element*>(p.q) + out_row[r] * d + col), values);
#pragma unroll
      for (int e = 0; e < kElems; ++e) q[r][c][e] = values[e] * p.scale;
    }
  }

  float o[kRows][kChunks][kElems] = {};
  float row_max[kRows], row_sum[kRows];  // base-2 running max and sum of this slot
#pragma unroll
  for (int r = 0; r < kRows; ++r) row_max[r] = -INFINITY, row_sum[r] = 0.f;

  const Element* k_base = static_cast<const Element*>(p.k);
  const Element* v_base = static_cast<const Element*>(p.v);
  // Every lane runs the same number of iterations (shuffles need the whole warp); missing keys are masked.
  for (int j0 = key_begin; j0 < key_end; j0 += kSlots * kUnroll) {
    uint4 k_raw[kUnroll][kChunks], v_raw[kUnroll][kChunks];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int j = j0 + u * kSlots + slot;
      const int64_t offset = j < key_end ? key_offset(p.cache, b, j, hk) : 0;
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const int64_t col = (c * kLanes + sub) * kElems;
        const bool load = j < key_end && col < d;
        k_raw[u][c] = load ? load_chunk(k_base + offset + col) : make_uint4(0, 0, 0, 0);
        v_raw[u][c] = load ? load_chunk(v_base + offset + col) : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int j = j0 + u * kSlots + slot;
      float k[kChunks][kElems], v[kChunks][kElems];
#pragma unroll
      for (int c = 0; c < kChunks; ++c) to_floats<Element>(k_raw[u][c], k[c]), to_floats<Element>(v_raw[u][c], v[c]);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        float dot = 0.f;
#pragma unroll
        for (int c = 0; c < kChunks; ++c)
#pragma unroll
          for (int e = 0; e < kElems; ++e) dot = fmaf(q[r][c][e], k[c][e], dot);
#pragma unroll
        for (int offset = kLanes / 2; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
        const bool visible = j < key_end && key_visible(p.mask, position[r], j);
        const float logit = visible ? capped_logit(dot, p.mask.softcap) * kLog2e : -INFINITY;
        const float new_max = fmaxf(row_max[r], logit);
        // With nothing visible yet the shift is 0, so exp2 of -inf stays 0 instead of becoming NaN.
        const float shift = new_max == -INFINITY ? 0.f : new_max;
        const float correction = exp2f(row_max[r] - shift), weight = exp2f(logit - shift);
        row_max[r] = new_max;
        row_sum[r] = fmaf(row_sum[r], correction, weight);
#pragma unroll
        for (int c = 0; c < kChunks; ++c)
#pragma unroll
          for (int e = 0; e < kElems; ++e) o[r][c][e] = fmaf(o[r][c][e], correction, weight * v[c][e]);
      }
    }
  }

  // Merge the slots: each publishes its state, then the block combines them column by column.
  __shared__ float slot_max[kSlots][kRows], slot_sum[kSlots][kRows];
  __shared__ float slot_o[kSlots][kRows][kWidth];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (sub == 0) slot_max[slot][r] = row_max[r], slot_sum[slot][r] = row_sum[r];
#pragma unroll
    for (int c = 0; c < kChunks; ++c)
#pragma unroll
      for (int e = 0; e < kElems; ++e) slot_o[slot][r][(c * kLanes + sub) * kElems + e] = o[r][c][e];
  }
  __syncthreads();

  for (int index = threadIdx.x; index < rows * kWidth; index += kThreads) {
    const int r = index / kWidth, col = index % kWidth;
    if (col >= d) continue;
    float max_all = -INFINITY;
    for (int s = 0; s < kSlots; ++s) max_all = fmaxf(max_all, slot_max[s][r]);
    const float shift = max_all == -INFINITY ? 0.f : max_all;
    float sum = 0.f, acc = 0.f;
    for (int s = 0; s < kSlots; ++s) {
      const float weight = exp2f(slot_max[s][r] - shift);
      sum = fmaf(slot_sum[s][r], weight, sum);
      acc = fmaf(slot_o[s][r][col], weight, acc);
    }
    const float value = sum > 0.f ? acc / sum : 0.f;
    const float lse2 = sum > 0.f ? max_all + log2f(sum) : -INFINITY;
    // out_row[r] again, from the block-uniform values (registers indexed by a runtime r would spill).
    const int row = row0 + r;
    const int64_t target = (b * p.q_len + row / group) * p.heads_q + hk * group + row % group;
    if (splits == 1) {
      store_float(value, static_cast<Element*>(p.out) + target * d + col);
      if (col == 0) p.lse[((b * p.heads_q + hk * group + row % group) * p.q_len) + row / group] = lse2 * kLn2;
    } else {
      const int64_t rows_out = p.batch * p.q_len * p.heads_q;
      parts.o[(split * rows_out + target) * d + col] = value;
      if (col == 0) parts.lse[split * rows_out + target] = lse2;
    }
  }
}

// One block per output row: weights 2^(lse_s - max) over the splits' normalised partials.
template <typename Element>
__global__ void __launch_bounds__(kThreads) decode_combine_kernel(DecodeParams p, int splits, Partials parts) {
  const int64_t row = blockIdx.x, rows_out = p.batch * p.q_len * p.heads_q, d = p.cache.head_dim;
  float max_all = -INFINITY;
  for (int s = 0; s < splits; ++s) max_all = fmaxf(max_all, parts.lse[s * rows_out + row]);
  const float shift = max_all == -INFINITY ? 0.f : max_all;
  float total = 0.f;
  for (int s = 0; s < splits; ++s) total += exp2f(parts.lse[s * rows_out + row] - shift);
  const float inverse = total > 0.f ? 1.f / total : 0.f;
  for (int64_t col = threadIdx.x; col < d; col += kThreads) {
    float acc = 0.f;
    for (int s = 0; s < splits; ++s) {
      const float weight = exp2f(parts.lse[s * rows_out + row] - shift);
      if (weight > 0.f) acc = fmaf(weight, parts.o[(s * rows_out + row) * d + col], acc);
    }
    store_float(acc * inverse, static_cast<Element*>(p.out) + row * d + col);
  }
  if (threadIdx.x == 0) {
    // out rows are [b, i, h]; lse is [b, h, i].
    const int64_t h = row % p.heads_q, i = (row / p.heads_q) % p.q_len, b = row / (p.heads_q * p.q_len);
    p.lse[(b * p.heads_q + h) * p.q_len + i] = total > 0.f ? (max_all + log2f(total)) * kLn2 : -INFINITY;
  }
}

int rows_per_pass(const DecodeParams& p) { return p.q_len * p.group() <= 4 ? 4 : 8; }

int64_t passes(const DecodeParams& p) {
  const int64_t rows = p.q_len * p.group(), per_pass = rows_per_pass(p);
  return (rows + per_pass - 1) / per_pass;
}

template <typename Element, int kLanes, int kChunks>
cudaError_t launch_with_lanes(const DecodeParams& p, int64_t splits, Partials parts, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(p.cache.heads_kv * passes(p)),
                  static_cast<unsigned>(p.batch));
  if (rows_per_pass(p) == 4)
    decode_split_kernel<Element, kLanes, kChunks, 4><<<grid, kThreads, 0, stream>>>(p, passes(p), parts);
  else
    decode_split_kernel<Element, kLanes, kChunks, 8><<<grid, kThreads, 0, stream>>>(p, passes(p), parts);
  if (cudaError_t status = cudaGetLastError(); status != cudaSuccess || splits == 1) return status;
  decode_combine_kernel<Element><<<static_cast<unsigned>(p.batch * p.q_len * p.heads_q), kThreads, 0, stream>>>(
      p, static_cast<int>(splits), parts);
  return cudaGetLastError();
}

// kLanes lanes of kChunks 16-byte chunks each cover a key row: the fewest lanes (at least 8, at most a warp) that do.
template <typename Element>
cudaError_t launch_with_element(const DecodeParams& p, int64_t splits, Partials parts, cudaStream_t stream) {
  const int64_t chunks = p.cache.head_dim / Chunk<Element>::kElems;
  if (chunks <= 8) return launch_with_lanes<Element, 8, 1>(p, splits, parts, stream);
  if (chunks <= 16) return launch_with_lanes<Element, 16, 1>(p, splits, parts, stream);
  if (chunks <= 32) return launch_with_lanes<Element, 32, 1>(p, splits, parts, stream);
  if constexpr (sizeof(Element) == 4) {
    if (chunks <= 64) return launch_with_lanes<Element, 32, 2>(p, splits, parts, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t sm_count(int* count) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cached[kMaxDevices] = {};
  int device = 0;
  if (cudaError_t status = cudaGetDevice(&device); status != cudaSuccess) return status;
  if (device < kMaxDevices && (*count = cached[device].load(std::memory_order_relaxed)) > 0) return cudaSuccess;
  if (cudaError_t status = cudaDeviceGetAttribute(count, cudaDevAttrMultiProcessorCount, device);
      status != cudaSuccess)
    return status;
  if (device < kMaxDevices) cached[device].store(*count, std::memory_order_relaxed);
  return cudaSuccess;
}

bool aligned_16(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer) % 16 == 0; }

}  // namespace
}  // namespace cuda_kernels::decode

using namespace cuda_kernels::decode;

cudaError_t plan_decode(const DecodeParams& p, DecodePlan* plan) {
  int sms = 0;
  if (cudaError_t status = sm_count(&sms); status != cudaSuccess) return status;
  const int64_t blocks = p.batch * p.cache.heads_kv * passes(p);
  const int64_t wanted = (sms * kBlocksPerSm + blocks - 1) / std::max<int64_t>(blocks, 1);
  const int64_t useful = (p.cache.capacity() + kMinKeysPerSplit - 1) / kMinKeysPerSplit;
  plan->splits = std::clamp<int64_t>(std::min(wanted, useful), 1, kMaxSplits);
  const int64_t rows_out = p.batch * p.q_len * p.heads_q;
  plan->workspace_bytes =
      plan->splits == 1 ? 0 : sizeof(float) * static_cast<size_t>(plan->splits * rows_out * (p.cache.head_dim + 1));
  return cudaSuccess;
}

cudaError_t launch_decode(const DecodeParams& p, const DecodePlan& plan, void* workspace, cudaStream_t stream) {
  // Backstops: the FFI handlers validate first. Grid y and z have 65535 blocks; positions are 32-bit in the kernel.
  const bool supported = p.cache.head_dim % 8 == 0 && p.cache.head_dim <= 256 && p.heads_q % p.cache.heads_kv == 0 &&
                         p.batch <= 65535 && p.cache.heads_kv * passes(p) <= 65535 &&
                         p.cache.capacity() < (int64_t{1} << 30) && plan.splits >= 1 && plan.splits <= kMaxSplits;
  const bool aligned = aligned_16(p.q) && aligned_16(p.k) && aligned_16(p.v);
  if (!supported || !aligned || (plan.splits > 1 && workspace == nullptr)) return cudaErrorInvalidValue;
  const int64_t rows_out = p.batch * p.q_len * p.heads_q;
  Partials parts{static_cast<float*>(workspace), nullptr};
  if (workspace != nullptr) parts.lse = parts.o + plan.splits * rows_out * p.cache.head_dim;
  switch (p.dtype) {
    case DType::kFloat32: return launch_with_element<float>(p, plan.splits, parts, stream);
    case DType::kFloat16: return launch_with_element<__half>(p, plan.splits, parts, stream);
    case DType::kBFloat16: return launch_with_element<__nv_bfloat16>(p, plan.splits, parts, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace jax_flash
