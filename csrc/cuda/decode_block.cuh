// What the split kernels share: the keys one block reads, and the end of a block, where the independent softmax
// states it kept (per lane group or per warp) are merged and written as the output or as one split's partial.
#pragma once

#include <cmath>
#include <cstdint>

#include "../attention_mask.h"
#include "decode_cuda.h"
#include "decode_elements.cuh"

namespace jax_flash::cuda_kernels::decode {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
// Splits start on multiples of this many keys, so a tile of 16 keys never straddles a page (page sizes are multiples
// of 16; a contiguous cache is one page per sequence).
constexpr int kKeyAlign = 16;

constexpr int kTileKeys = 16;  // keys per tile of the tensor-core kernels
constexpr int kMmaRows = 16;   // packed rows per pass of the tensor-core kernels: the M of mma m16n8k16
// The most blocks per cluster where the splits combine in a cluster: 8 is portable, sm_90 allows 16 on request
// (cudaFuncAttributeNonPortableClusterSizeAllowed).
constexpr int kMaxClusterSplits = 16;

struct Partials {
  float* o;    // [splits, rows_out, head_dim], each split normalised by its own sum
  float* lse;  // [splits, rows_out], base-2
};

// How a launch lays out its blocks, and what the launch tells every block. The grid is (splits, kv heads x passes,
// batch), or with heads_fastest (kv heads x passes, splits, batch), so that the blocks reading the same keys of all
// kv heads are launched next to each other.
struct LaunchShape {
  int passes;  // passes of packed rows per kv head (group)
  bool heads_fastest;
  bool cluster_combine;  // the splits of a (sequence, kv head, pass) are one cluster, which combines their partials
};

// What one block owns, from its grid position.
struct BlockIndex {
  int64_t b, hk;
  int row0;  // first packed row of this pass
  int split, splits;
};

__device__ __forceinline__ BlockIndex block_index(const LaunchShape& shape, int rows_per_pass) {
  const bool heads_fastest = shape.heads_fastest;
  const int passes = shape.passes;
  const int head_pass = heads_fastest ? blockIdx.x : blockIdx.y;
  BlockIndex index;
  index.b = blockIdx.z;
  index.hk = head_pass / passes;
  index.row0 = head_pass % passes * rows_per_pass;
  index.split = heads_fastest ? blockIdx.y : blockIdx.x;
  index.splits = heads_fastest ? gridDim.y : gridDim.x;
  return index;
}

// A block owns packed rows [row0, row0 + rows) of kv head hk of sequence b (row = i * group + g: query head g of the
// group at new position i) and split `split` of the keys those rows may see.
struct BlockKeys {
  int lowest, highest;     // positions of the block's first and last rows (rows are ordered by position)
  int key_begin, key_end;  // this split's keys
};

__device__ __forceinline__ BlockKeys block_keys(const DecodeParams& p, int64_t b, int row0, int rows, int split,
                                                int splits) {
  const int group = static_cast<int>(p.group());
  const int length = static_cast<int>(p.length(b));
  const int first_position = length - static_cast<int>(p.q_len);
  BlockKeys keys;
  keys.lowest = first_position + row0 / group;
  keys.highest = first_position + (row0 + rows - 1) / group;
  const int begin = static_cast<int>(first_visible_key(p.mask, max(keys.lowest, 0))) / kKeyAlign * kKeyAlign;
  const int end = min(keys.highest + 1, length);
  const int chunk = ((max(end - begin, 0) + splits - 1) / splits + kKeyAlign - 1) / kKeyAlign * kKeyAlign;
  keys.key_begin = begin + split * chunk;
  keys.key_end = min(end, keys.key_begin + chunk);
  return keys;
}

// Position of packed row `row` and its index in out ([b, i, h] rows of head_dim).
__device__ __forceinline__ int row_position(const DecodeParams& p, int64_t b, int row) {
  return static_cast<int>(p.length(b) - p.q_len) + row / static_cast<int>(p.group());
}

__device__ __forceinline__ int64_t out_row(const DecodeParams& p, int64_t b, int64_t hk, int row) {
  const int64_t group = p.group();
  return (b * p.q_len + row / group) * p.heads_q + hk * group + row % group;
}

// A page id from the table, clamped to the pool: a bad table gives wrong values, never an out-of-bounds read.
__device__ __forceinline__ int64_t clamped_page_id(const PagedCache& c, int64_t id) {
  return id < 0 ? 0 : (id >= c.num_pages ? c.num_pages - 1 : id);
}

// Element offset of key j of sequence b, kv head h. 32-bit division: positions are far below 2^31, and the 64-bit
// one costs several times more per key.
__device__ __forceinline__ int64_t key_offset(const PagedCache& c, int64_t b, int j, int64_t h) {
  const int page_size = static_cast<int>(c.page_size);
  const int64_t id = clamped_page_id(c, c.page_table[b * c.pages_per_seq + j / page_size]);
  return ((id * c.page_size + j % page_size) * c.heads_kv + h) * c.head_dim;
}

// Programmatic dependent launch (sm_90; no-ops elsewhere and when the next kernel was launched normally): a split
// kernel's blocks announce that they have passed their loads, so the combine kernel may launch, and the combine
// waits until the split grid has completed and its writes are visible.
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void wait_for_prerequisite_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Thread-block clusters (sm_90): a barrier over every thread of the cluster (release/acquire, so shared-memory
// writes before it are visible to every block of the cluster after it), and a load from block `rank`'s shared
// memory at the address `local` has in this block's. Only launched on devices and builds of sm_90 or newer
// (launch_decode checks both), so the older architectures' bodies are never run.
__device__ __forceinline__ void cluster_barrier() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#endif
}

__device__ __forceinline__ float load_cluster_shared(const float* local, unsigned rank) {
  float x = 0.f;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(local));
  uint32_t remote = 0;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(address), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(x) : "r"(remote) : "memory");
#endif
  return x;
}

// The larger of a and b, NaN if either is: a split whose visible scores hold a NaN has a NaN lse, and the merged
// row must show it (fmaxf alone would drop it).
__device__ __forceinline__ float nan_max(float a, float b) { return isnan(a) || isnan(b) ? NAN : fmaxf(a, b); }

// Row r, column col of the block's output from kStates softmax states: state s has base-2 running max
// state_max[s * kRows + r], sum state_sum[...] and unnormalised output state_o[(s * kRows + r) * kStride + col]
// (a kernel may pad its rows past the head dim so that storing them is free of bank conflicts).
// Returns the normalised value and the row's base-2 lse.
struct MergedState {
  float value, lse2;
};

template <int kStates, int kRows, int kStride>
__device__ __forceinline__ MergedState merge_states(const float* state_max, const float* state_sum,
                                                    const float* state_o, int r, int col) {
  float max_all = -INFINITY;
  for (int s = 0; s < kStates; ++s) max_all = fmaxf(max_all, state_max[s * kRows + r]);
  // With nothing visible the shift is 0, so exp2 of -inf stays 0 instead of becoming NaN.
  const float shift = max_all == -INFINITY ? 0.f : max_all;
  float sum = 0.f, acc = 0.f;
  for (int s = 0; s < kStates; ++s) {
    const float weight = exp2f(state_max[s * kRows + r] - shift);
    sum = fmaf(state_sum[s * kRows + r], weight, sum);
    acc = fmaf(state_o[(s * kRows + r) * kStride + col], weight, acc);
  }
  // A sum of 0: nothing visible. A NaN sum (a NaN among the visible entries) stays NaN, so the combine passes it on.
  return {sum == 0.f ? 0.f : acc / sum, sum == 0.f ? -INFINITY : max_all + log2f(sum)};
}

// Merges the block's softmax states (merge_states) and writes the output, or this split's partial. The whole block
// takes part.
template <typename Element, int kStates, int kRows, int kWidth, int kStride>
__device__ void merge_and_store(const DecodeParams& p, const Partials& parts, const BlockIndex& block, int rows,
                                const float* state_max, const float* state_sum, const float* state_o) {
  const int64_t b = block.b, hk = block.hk;
  const int row0 = block.row0, split = block.split, splits = block.splits;
  const int64_t d = p.cache.head_dim;
  for (int index = threadIdx.x; index < rows * kWidth; index += blockDim.x) {
    const int r = index / kWidth, col = index % kWidth;
    if (col >= d) continue;
    const auto [value, lse2] = merge_states<kStates, kRows, kStride>(state_max, state_sum, state_o, r, col);
    const int row = row0 + r;
    const int64_t target = out_row(p, b, hk, row);
    if (splits == 1) {
      store_float(value, static_cast<Element*>(p.out) + target * d + col);
      const int64_t group = p.group();
      if (col == 0) p.lse[(b * p.heads_q + hk * group + row % group) * p.q_len + row / group] = lse2 * kLn2;
    } else {
      const int64_t rows_out = p.batch * p.q_len * p.heads_q;
      parts.o[(split * rows_out + target) * d + col] = value;
      if (col == 0) parts.lse[split * rows_out + target] = lse2;
    }
  }
}

// The end of a block whose split's partners are the other blocks of its cluster (one cluster per (sequence, kv head,
// pass), block rank = split): the combine without a second kernel or a round trip of the partials through global
// memory. Each block merges its warps' states in place (row r's normalised output over state slot 0, its base-2 lse
// into split_lse[r]). After a cluster barrier each block reads every split's lse once and keeps each row's split
// weights in its own shared memory (over state slot 1, free by then); block c then writes every splits-th group of
// blockDim.x output elements, weighing the splits' partials read from their shared memory, in split order
// (deterministic) and with decode_combine_kernel's rules for empty rows and NaN. A second barrier keeps every block's
// shared memory alive until the others have read it.
template <typename Element, int kStates, int kRows, int kWidth, int kStride>
__device__ void merge_and_combine_in_cluster(const DecodeParams& p, const BlockIndex& block, int rows,
                                             const float* state_max, const float* state_sum, float* state_o,
                                             float* split_lse) {
  static_assert(kStates >= 2 && kRows * (kMaxClusterSplits + 2) <= kRows * kStride, "the weights fit state slot 1");
  const int64_t b = block.b, hk = block.hk;
  const int d = static_cast<int>(p.cache.head_dim), splits = block.splits;
  for (int index = threadIdx.x; index < rows * kWidth; index += blockDim.x) {
    const int r = index / kWidth, col = index % kWidth;
    if (col >= d) continue;
    // This thread alone reads column col of row r of every state, so it may overwrite slot 0's.
    const MergedState merged = merge_states<kStates, kRows, kStride>(state_max, state_sum, state_o, r, col);
    state_o[r * kStride + col] = merged.value;
    if (col == 0) split_lse[r] = merged.lse2;
  }
  cluster_barrier();
  // Per row r: weight[s * kRows + r] of split s (0 for an empty split, or one far below the max), their total, and
  // the largest lse (NaN if any split's is). splits <= kMaxClusterSplits (launch_decode).
  float* weight = state_o + kRows * kStride;
  float* row_total = weight + kMaxClusterSplits * kRows;
  float* row_max = row_total + kRows;
  for (int r = threadIdx.x; r < rows; r += blockDim.x) {
    float max_all = -INFINITY;
    for (int s = 0; s < splits; ++s) {
      const float lse = load_cluster_shared(split_lse + r, s);
      weight[s * kRows + r] = lse;
      max_all = nan_max(max_all, lse);
    }
    const float shift = max_all == -INFINITY ? 0.f : max_all;
    float total = 0.f;
    for (int s = 0; s < splits; ++s) total += weight[s * kRows + r] = exp2f(weight[s * kRows + r] - shift);
    row_total[r] = total;
    row_max[r] = max_all;
  }
  __syncthreads();
  const int group = static_cast<int>(p.group());
  for (int index = block.split * blockDim.x + threadIdx.x; index < rows * d; index += splits * blockDim.x) {
    const int r = index / d, col = index % d;
    float acc = 0.f;
    for (int s = 0; s < splits; ++s) {
      const float w = weight[s * kRows + r];
      if (w == 0.f) continue;  // its partial need not be read
      acc = fmaf(w, load_cluster_shared(state_o + r * kStride + col, s), acc);
    }
    const float total = row_total[r];
    const int row = block.row0 + r;
    store_float(total == 0.f ? 0.f : acc / total, static_cast<Element*>(p.out) + out_row(p, b, hk, row) * d + col);
    if (col == 0)
      p.lse[(b * p.heads_q + hk * group + row % group) * p.q_len + row / group] =
          total == 0.f ? -INFINITY : (row_max[r] + log2f(total)) * kLn2;
  }
  cluster_barrier();
}

}  // namespace jax_flash::cuda_kernels::decode
