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

// Merges kStates softmax states of the block's rows: state s has base-2 running max state_max[s * kRows + r], sum
// state_sum[...] and unnormalised output state_o[(s * kRows + r) * kWidth + col]. The whole block takes part.
template <typename Element, int kStates, int kRows, int kWidth>
__device__ void merge_and_store(const DecodeParams& p, const Partials& parts, const BlockIndex& block, int rows,
                                const float* state_max, const float* state_sum, const float* state_o) {
  const int64_t b = block.b, hk = block.hk;
  const int row0 = block.row0, split = block.split, splits = block.splits;
  const int64_t d = p.cache.head_dim;
  for (int index = threadIdx.x; index < rows * kWidth; index += blockDim.x) {
    const int r = index / kWidth, col = index % kWidth;
    if (col >= d) continue;
    float max_all = -INFINITY;
    for (int s = 0; s < kStates; ++s) max_all = fmaxf(max_all, state_max[s * kRows + r]);
    // With nothing visible the shift is 0, so exp2 of -inf stays 0 instead of becoming NaN.
    const float shift = max_all == -INFINITY ? 0.f : max_all;
    float sum = 0.f, acc = 0.f;
    for (int s = 0; s < kStates; ++s) {
      const float weight = exp2f(state_max[s * kRows + r] - shift);
      sum = fmaf(state_sum[s * kRows + r], weight, sum);
      acc = fmaf(state_o[(s * kRows + r) * kWidth + col], weight, acc);
    }
    // A sum of 0: nothing visible. A NaN sum (a NaN among the visible entries) stays NaN, so the combine passes it on.
    const float value = sum == 0.f ? 0.f : acc / sum;
    const float lse2 = sum == 0.f ? -INFINITY : max_all + log2f(sum);
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

}  // namespace jax_flash::cuda_kernels::decode
