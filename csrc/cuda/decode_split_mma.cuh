// The fp16/bf16 split kernel on tensor cores for head dims up to 64 and 129..256 (the "lanes" kernel; 65..128 take
// the rows kernel, decode_split_rows.cuh). Decoding is bound by memory bandwidth, so the design goals are bytes in
// flight and few instructions per key byte:
//
// * The block's packed rows (all query heads of one kv head at every new position, up to 16) are the M = 16 rows of
//   mma.sync m16n8k16, so each K/V row is read once for the whole GQA group and both products (Q K^T and P V) cost
//   about two tensor-core instructions per key. Rows past the group are zeros.
// * Each warp streams its own tiles of 16 keys (tiles warp, warp + kWarps, ... of the block's split) through a
//   kStages-deep cp.async pipeline in shared memory. Every lane copies exactly the 16-byte chunks that it later reads
//   back as mma operands, so the staging needs no barrier, no swizzle and is free of bank conflicts, and the next
//   tiles' copies are in flight while the current one is computed.
// * The chunk-to-lane assignment puts operands straight into mma layout. Q K^T: the head_dim order inside a k-step
//   may be permuted as long as Q and K agree, so lane (g, t) loads whole 16-byte K chunks (8 columns: two k-steps)
//   of key g and takes Q in the same order. P V: lane (g, t) loads 16-byte V chunks of keys 2t, 2t+1, 2t+8, 2t+9 and
//   pairs their elements with a byte permute; output column g of n-tile (w, e) is head_dim column (8w + g) * 8 + e.
// * Softmax state is per warp with a max reduction over the 4 lanes of a row per tile (not per key); the output is
//   rescaled only when a row's max moved. The warps' states are merged once at the end of the split.
// * Splits start on multiples of 16 keys, so a tile lies in one page: one page-table read per tile. Keys past a
//   sequence's length and head_dim columns past the end are never read (their chunks are zero-filled).
#pragma once

#include <cmath>
#include <cstdint>

#include "decode_block.cuh"
#include "decode_softmax.cuh"
#include "tensor_core/ptx.cuh"

namespace jax_flash::cuda_kernels::decode {

using tensor_core::cp_async_16_stream;
using tensor_core::cp_async_commit;
using tensor_core::cp_async_wait;
using tensor_core::l2_evict_first_policy;
using tensor_core::mma_16816;
using tensor_core::shared_address;

// kChunksK 16-byte K chunks per lane and n-tile cover head_dim padded to 32 * kChunksK; kChunksV V chunks per lane
// and key cover head_dim padded to 64 * kChunksV (the output width).
template <typename Element, int kChunksK, int kChunksV, int kWarps, int kStages>
struct MmaKernel {
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kSlots = 2 * kChunksK + 4 * kChunksV;  // chunks per lane per tile
  static constexpr int kWidth = 64 * kChunksV;
  static constexpr int kQuerySteps = 2 * kChunksK;  // k-steps of Q K^T
  static constexpr size_t kQueryBytes = size_t{16} * kQuerySteps * 32;
  static constexpr size_t kPipeBytes = size_t{16} * kWarps * kStages * kSlots * 32;
  static constexpr size_t kMergeBytes = sizeof(float) * kWarps * kMmaRows * kWidth;
  static constexpr size_t kSharedBytes = kQueryBytes + (kPipeBytes > kMergeBytes ? kPipeBytes : kMergeBytes);
};

template <typename Element, int kChunksK, int kChunksV, int kWarps, int kStages>
__global__ void __launch_bounds__(kWarps * 32, 1) decode_mma_kernel(DecodeParams p, LaunchShape shape,
                                                                           Partials parts) {
  using Shape = MmaKernel<Element, kChunksK, kChunksV, kWarps, kStages>;
  constexpr int kSlots = Shape::kSlots;
  extern __shared__ uint4 shared[];
  uint4* query_frags = shared;                          // [kQuerySteps][32]: mma A operands of Q
  uint4* pipe = shared + Shape::kQuerySteps * 32;       // [kWarps][kStages][kSlots][32]
  float* merge_o = reinterpret_cast<float*>(pipe);      // [kWarps][16][kWidth], once the pipeline is drained
  __shared__ float warp_max[kWarps][kMmaRows], warp_sum[kWarps][kMmaRows];

  const BlockIndex block = block_index(shape, kMmaRows);
  const int64_t hk = block.hk, b = block.b;
  const int row0 = block.row0;
  const int rows = min(kMmaRows, static_cast<int>(p.q_len * p.group()) - row0);
  const int d = static_cast<int>(p.cache.head_dim);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const BlockKeys keys = block_keys(p, b, row0, rows, block.split, block.splits);

  const Element* k_cache = static_cast<const Element*>(p.k);
  const Element* v_cache = static_cast<const Element*>(p.v);
  const int64_t key_stride = p.cache.heads_kv * p.cache.head_dim;
  uint4* lane_pipe = pipe + warp * kStages * kSlots * 32 + lane;
  const int tiles = (max(keys.key_end - keys.key_begin, 0) + kTileKeys - 1) / kTileKeys;
  const int warp_tiles = tiles > warp ? (tiles - warp - 1) / kWarps + 1 : 0;
  auto tile_start = [&](int i) { return keys.key_begin + (warp + i * kWarps) * kTileKeys; };

  const uint64_t policy = l2_evict_first_policy();  // K and V are read once
  // Slots of a tile: K chunk c of key 8n + g (n-tile n) at n * kChunksK + c, columns (4c + t) * 8; V chunk w of key
  // 2t + (q % 2) + 8 * (q / 2) at 2 * kChunksK + q * kChunksV + w, columns (8w + g) * 8.
  auto issue = [&](int i) {
    const int j0 = tile_start(i);
    const int64_t base = tile_offset(p.cache, b, j0, hk);
    uint4* dst = lane_pipe + (i % kStages) * kSlots * 32;
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int c = 0; c < kChunksK; ++c) {
        const int key = 8 * n + g, col = (4 * c + t) * 8;
        const bool valid = j0 + key < keys.key_end && col < d;
        cp_async_16_stream(shared_address(dst + (n * kChunksK + c) * 32),
                           valid ? k_cache + base + key * key_stride + col : k_cache, valid, policy);
      }
#pragma unroll
    for (int q = 0; q < 4; ++q)
#pragma unroll
      for (int w = 0; w < kChunksV; ++w) {
        const int key = 2 * t + q % 2 + 8 * (q / 2), col = (8 * w + g) * 8;
        const bool valid = j0 + key < keys.key_end && col < d;
        cp_async_16_stream(shared_address(dst + (2 * kChunksK + q * kChunksV + w) * 32),
                           valid ? v_cache + base + key * key_stride + col : v_cache, valid, policy);
      }
  };

  // Rows g and g + 8 of this lane (padding rows take the last real row's position).
  WarpSoftmax softmax(p, row_position(p, b, row0 + min(g, rows - 1)), row_position(p, b, row0 + min(g + 8, rows - 1)),
                      lane);
  float o[kChunksV][8][4] = {};

  // Tiles that need a per-key mask: past the split's end, or not inside every row's causal window.
  const int unmasked_end = min(keys.key_end, keys.lowest + 1);
  const int unmasked_begin = p.mask.window_left < 0 ? 0 : keys.highest - static_cast<int>(p.mask.window_left);

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < warp_tiles) issue(s);
    cp_async_commit();
  }

  // Q as A operands, loaded while the first tiles are in flight. k-step s = 2c + h of lane quad t holds head_dim columns (4c + t) * 8 + 4h .. + 3, the order in
  // which K chunks are loaded below: a = {row g cols +0..1, row g+8 cols +0..1, row g +2..3, row g+8 +2..3}.
  for (int index = threadIdx.x; index < Shape::kQuerySteps * 32; index += Shape::kThreads) {
    const int s = index / 32, l = index % 32;
    const int col = (4 * (s / 2) + l % 4) * 8 + 4 * (s % 2);
    uint2 low = {0, 0}, high = {0, 0};
    const Element* q = static_cast<const Element*>(p.q);
    if (col < d && l / 4 < rows) low = *reinterpret_cast<const uint2*>(q + out_row(p, b, hk, row0 + l / 4) * d + col);
    if (col < d && l / 4 + 8 < rows)
      high = *reinterpret_cast<const uint2*>(q + out_row(p, b, hk, row0 + l / 4 + 8) * d + col);
    query_frags[index] = make_uint4(low.x, high.x, low.y, high.y);
  }
  __syncthreads();

  for (int i = 0; i < warp_tiles; ++i) {
    // The stage refilled here was read by tile i - 1, whose mma instructions (asm volatile, in order) consumed it.
    if (i + kStages - 1 < warp_tiles) issue(i + kStages - 1);
    cp_async_commit();
    cp_async_wait<kStages - 1>();
    const uint4* src = lane_pipe + (i % kStages) * kSlots * 32;
    const int j0 = tile_start(i);

    float s[2][4] = {};
#pragma unroll
    for (int c = 0; c < kChunksK; ++c) {
      const uint4 k0 = src[c * 32], k1 = src[(kChunksK + c) * 32];
      const uint4 a0 = query_frags[(2 * c) * 32 + lane], a1 = query_frags[(2 * c + 1) * 32 + lane];
      mma_16816<Element>(s[0], a0, k0.x, k0.y);
      mma_16816<Element>(s[1], a0, k1.x, k1.y);
      mma_16816<Element>(s[0], a1, k0.z, k0.w);
      mma_16816<Element>(s[1], a1, k1.z, k1.w);
    }

    const bool masked = j0 + kTileKeys > unmasked_end || j0 < unmasked_begin;
    const float2 rescale = softmax.update(s, j0, masked, keys.key_end);
    if (WarpSoftmax::any_moved(rescale)) {
#pragma unroll
      for (int w = 0; w < kChunksV; ++w)
#pragma unroll
        for (int e = 0; e < 8; ++e) o[w][e][0] *= rescale.x, o[w][e][1] *= rescale.x, o[w][e][2] *= rescale.y,
                                    o[w][e][3] *= rescale.y;
    }
    const uint4 probs = probabilities_operand<Element>(s);
#pragma unroll
    for (int w = 0; w < kChunksV; ++w) {
      const uint4 v0 = src[(2 * kChunksK + w) * 32], v1 = src[(2 * kChunksK + kChunksV + w) * 32];
      const uint4 v8 = src[(2 * kChunksK + 2 * kChunksV + w) * 32], v9 = src[(2 * kChunksK + 3 * kChunksV + w) * 32];
      const uint32_t words0[4] = {v0.x, v0.y, v0.z, v0.w}, words1[4] = {v1.x, v1.y, v1.z, v1.w};
      const uint32_t words8[4] = {v8.x, v8.y, v8.z, v8.w}, words9[4] = {v9.x, v9.y, v9.z, v9.w};
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        // Element e of keys (2t, 2t+1) and (2t+8, 2t+9): the low or high halves of word e / 2.
        const uint32_t selector = e % 2 ? 0x7632 : 0x5410;
        const uint32_t b0 = __byte_perm(words0[e / 2], words1[e / 2], selector);
        const uint32_t b1 = __byte_perm(words8[e / 2], words9[e / 2], selector);
        mma_16816<Element>(o[w][e], probs, b0, b1);
      }
    }
  }
  cp_async_wait<0>();
  allow_dependent_launch();

  // The warps' states go to shared memory (over the drained pipeline) and are merged.
  softmax.reduce_sums();
  __syncthreads();
  softmax.store(&warp_max[0][0], &warp_sum[0][0], warp, g);
  float* warp_o = merge_o + warp * kMmaRows * Shape::kWidth;
#pragma unroll
  for (int w = 0; w < kChunksV; ++w)
#pragma unroll
    for (int e = 0; e < 8; ++e)
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        const int col = (8 * w + 2 * t + x) * 8 + e;
        warp_o[g * Shape::kWidth + col] = o[w][e][x];
        warp_o[(g + 8) * Shape::kWidth + col] = o[w][e][2 + x];
      }
  __syncthreads();
  merge_and_store<Element, kWarps, kMmaRows, Shape::kWidth>(p, parts, block, rows, &warp_max[0][0], &warp_sum[0][0],
                                                            merge_o);
}

}  // namespace jax_flash::cuda_kernels::decode
