// The fp16/bf16 split kernel: each warp stages whole key rows of K and V in shared memory with cp.async and reads its
// mma operands from them with ldmatrix. kWidth (64, 128 or 256) is the head dim the rows are staged for; narrower
// head dims zero-fill the columns past them.
//
// * Packed rows (all query heads of one kv head at every new position, up to 16) are the M = 16 rows of m16n8k16, and
//   the online softmax keeps its state per warp (decode_softmax.cuh).
// * Rows are padded by 16 bytes, so the 8 rows of an ldmatrix fall in distinct banks without a swizzle. K is read as
//   the "col" B operand of Q K^T directly, V transposed (ldmatrix.trans) for P V.
// * The warps share one kv head: each runs its own kStages-deep pipeline of 16-key tiles (tiles warp, warp + kWarps,
//   ... of the split) with no block barrier until the end, where their softmax states are merged.
// * Keys past the split's end are masked and their V rows zero-filled by cp.async, so that a probability of 0 never
//   meets stale bytes. Head-dim columns past head_dim are zero-filled too.
// * Few instructions per tile: the copies step by precomputed strides (recomputing each chunk's address took about
//   460 SASS instructions per 16-key tile; dropping that raised the H200 read rate 2-5%), Q stays in registers, the
//   softmax's mask and softcap branches are taken once per tile and 2^x is the bare SFU op (about 250 instructions
//   per tile remain; the last cut, from about 330, did not change the rate at 1 x 131k).
#pragma once

#include <cmath>
#include <cstdint>

#include "decode_block.cuh"
#include "decode_softmax.cuh"
#include "tensor_core/ptx.cuh"

namespace jax_flash::cuda_kernels::decode {

template <typename Element, int kWidth, int kWarps, int kStages>
struct RowsKernel {
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRowStride = kWidth + 8;  // elements: the 16-byte pad staggers rows across banks
  static constexpr int kSteps = kWidth / 16;     // k-steps of Q K^T, and pairs of output n-tiles of P V
  static constexpr int kTileElements = 2 * kTileKeys * kRowStride;  // K rows, then V rows
  static constexpr size_t kQueryBytes = size_t{16} * kSteps * 32;   // A operands of Q
  static constexpr size_t kPipeBytes = sizeof(Element) * kTileElements * kWarps * kStages;
  // The warps' outputs, over the drained pipe: rows padded by 8 floats, so that the 8 row groups of a warp's fragment
  // stores fall in distinct banks (unpadded, every store was an 8-way bank conflict).
  static constexpr int kMergeStride = kWidth + 8;
  static constexpr size_t kMergeBytes = sizeof(float) * kWarps * kMmaRows * kMergeStride;
  static constexpr size_t kSharedBytes = kQueryBytes + (kPipeBytes > kMergeBytes ? kPipeBytes : kMergeBytes);
  // Blocks that fit an sm_90 SM's 227 KiB (1 KiB reserved per block), for the register bound of __launch_bounds__;
  // at most 4, so that blocks of 4 warps may use 128 registers a thread (rows2 at head dim 64 spilled with 5).
  static constexpr int kFitting = (227 * 1024) / (kSharedBytes + 2048);
  static constexpr int kMinBlocks = kFitting < 1 ? 1 : (kFitting > 4 ? 4 : kFitting);
};

template <typename Element, int kWidth, int kWarps, int kStages>
__global__ void __launch_bounds__(kWarps * 32, (RowsKernel<Element, kWidth, kWarps, kStages>::kMinBlocks))
    decode_rows_kernel(DecodeParams p, LaunchShape shape, Partials parts) {
  using tensor_core::cp_async_16_stream;
  using tensor_core::cp_async_commit;
  using tensor_core::cp_async_wait;
  using tensor_core::l2_evict_first_policy;
  using tensor_core::ldmatrix_x4;
  using tensor_core::ldmatrix_x4_trans;
  using tensor_core::mma_16816;
  using tensor_core::shared_address;
  using Shape = RowsKernel<Element, kWidth, kWarps, kStages>;
  constexpr int kStride = Shape::kRowStride, kTileRows = kTileKeys;
  extern __shared__ uint4 shared[];
  uint4* query_frags = shared;  // [kSteps][32]: A operands of Q
  Element* pipe = reinterpret_cast<Element*>(shared + Shape::kQueryBytes / 16);  // [kWarps][kStages][2][16][kStride]
  float* merge_o = reinterpret_cast<float*>(pipe);  // [kWarps][16][kMergeStride], once the pipeline is drained
  __shared__ float warp_max[kWarps][16], warp_sum[kWarps][16];

  const BlockIndex block = block_index(shape, kMmaRows);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4;
  const int64_t hk = block.hk, b = block.b;
  const int row0 = block.row0;
  const int rows = min(kMmaRows, static_cast<int>(p.q_len * p.group()) - row0);
  const int d = static_cast<int>(p.cache.head_dim);
  const BlockKeys keys = block_keys(p, b, row0, rows, block.split, block.splits);

  const Element* k_cache = static_cast<const Element*>(p.k);
  const Element* v_cache = static_cast<const Element*>(p.v);
  const int64_t key_stride = p.cache.heads_kv * p.cache.head_dim;
  Element* warp_pipe = pipe + warp * kStages * Shape::kTileElements;
  const int tiles = (max(keys.key_end - keys.key_begin, 0) + kTileRows - 1) / kTileRows;
  const int warp_tiles = tiles > warp ? (tiles - warp - 1) / kWarps + 1 : 0;
  auto tile_start = [&](int i) { return keys.key_begin + (warp + i * kWarps) * kTileRows; };

  // Tile i goes to stage i % kStages: rows 0-15 K of keys j0.., rows 16-31 V. kLanesPerRow lanes share a row, each
  // copying kChunksPerLane 16-byte chunks kLanesPerRow chunks apart, so one warp-wide copy moves kCopyRows rows of
  // whole 128-byte lines. Recomputing every chunk's address cost more instructions than the rest of the tile: a
  // lane's row and column stay fixed, its chunks of a row are immediate offsets, its rows step by kCopyRows keys, and
  // the tile's page and row within the page advance by additions (tiles are issued in order, kWarps tiles apart), so
  // the page table is read once per page, a tile ahead. Chunks past the keys or head_dim are zero-filled. L2 fetches
  // whole 128-byte lines from DRAM at the first request and evicts them first, as they are read once (together 1-6%
  // faster on the H200 than fetching 256 bytes under the default policy).
  constexpr int kLanesPerRow = 8, kCopyRows = 32 / kLanesPerRow, kChunksPerLane = kWidth / 8 / kLanesPerRow;
  static_assert(kWidth % (8 * kLanesPerRow) == 0 && kTileRows % kCopyRows == 0, "a warp copies whole lines");
  const int lane_row = lane / kLanesPerRow, lane_col = lane % kLanesPerRow * 8;
  const int64_t copy_stride = kCopyRows * key_stride;
  const int64_t page_stride = p.cache.page_size * key_stride;
  const int64_t lane_offset_in_row = lane_row * key_stride + hk * p.cache.head_dim + lane_col;
  const int32_t* page_ids = p.cache.page_table + b * p.cache.pages_per_seq;
  const int page_size = static_cast<int>(p.cache.page_size);
  int next_key = tile_start(0), page = next_key / page_size, row_in_page = next_key % page_size;
  // The id of page `index` (0 past the table, where no tile is left to issue), read when a tile enters the page but
  // used only when the next tile is issued, a step later, so that small pages do not stall a warp on the load.
  auto read_page_id = [&](int index) -> int32_t { return index < p.cache.pages_per_seq ? page_ids[index] : 0; };
  // Element offset of the lane's first chunk on row 0 of a page (page ids outside the pool clamped).
  auto page_offset = [&](int64_t id) -> int64_t {
    return clamped_page_id(p.cache, id) * page_stride + lane_offset_in_row;
  };
  int32_t page_id = read_page_id(page);
  bool page_entered = true;  // page_id is not yet in lane_page_offset
  int64_t lane_page_offset = 0;
  const uint32_t lane_pipe_address =
      shared_address(warp_pipe) + static_cast<uint32_t>(sizeof(Element) * (lane_row * kStride + lane_col));
  const bool full_width = d == kWidth;
  const uint64_t policy = l2_evict_first_policy();
  auto issue = [&](int i) {
    if (page_entered) lane_page_offset = page_offset(page_id), page_entered = false;
    const int64_t lane_offset = lane_page_offset + row_in_page * key_stride;
    const Element* k_source = k_cache + lane_offset;
    const Element* v_source = v_cache + lane_offset;
    const int valid_rows = min(kTileRows, keys.key_end - next_key);
    const uint32_t stage = lane_pipe_address + (i % kStages) * Shape::kTileElements * sizeof(Element);
    constexpr uint32_t kCopyBytes = kCopyRows * kStride * sizeof(Element);
    constexpr uint32_t kVBytes = kTileRows * kStride * sizeof(Element);
    constexpr int kChunkStep = 8 * kLanesPerRow;  // elements between a lane's chunks of a row
    if (full_width && valid_rows == kTileRows) {  // every tile but a split's last, at head_dim kWidth
#pragma unroll
      for (int u = 0; u < kTileRows / kCopyRows; ++u)
#pragma unroll
        for (int c = 0; c < kChunksPerLane; ++c) {
          const uint32_t target = stage + u * kCopyBytes + c * kChunkStep * sizeof(Element);
          cp_async_16_stream(target, k_source + u * copy_stride + c * kChunkStep, policy);
          cp_async_16_stream(target + kVBytes, v_source + u * copy_stride + c * kChunkStep, policy);
        }
    } else {
#pragma unroll
      for (int u = 0; u < kTileRows / kCopyRows; ++u)
#pragma unroll
        for (int c = 0; c < kChunksPerLane; ++c) {
          const bool valid = lane_col + c * kChunkStep < d && u * kCopyRows + lane_row < valid_rows;
          const uint32_t target = stage + u * kCopyBytes + c * kChunkStep * sizeof(Element);
          cp_async_16_stream(target, valid ? k_source + u * copy_stride + c * kChunkStep : k_cache, valid, policy);
          cp_async_16_stream(target + kVBytes, valid ? v_source + u * copy_stride + c * kChunkStep : v_cache, valid,
                             policy);
        }
    }
    cp_async_commit();
    next_key += kWarps * kTileRows, row_in_page += kWarps * kTileRows;
    if (row_in_page >= page_size) {
      while (row_in_page >= page_size) row_in_page -= page_size, ++page;
      page_id = read_page_id(page), page_entered = true;
    }
  };
  // ldmatrix lanes: lane l addresses row l % 8 of matrix l / 8. K: matrices (keys 0-7, 8-15) x (columns +0, +8) in
  // the order b0, b1 of n-tile 0, then of n-tile 1. V transposed: (keys 0-7, 8-15) x (columns +0, +8) in the order
  // b0, b1 of output n-tile 2p, then of 2p + 1.
  const int m = lane / 8, r = lane % 8;
  const uint32_t k_lane = static_cast<uint32_t>(sizeof(Element) * (((m / 2) * 8 + r) * kStride + (m % 2) * 8));
  const uint32_t v_lane =
      static_cast<uint32_t>(sizeof(Element) * ((kTileRows + (m % 2) * 8 + r) * kStride + (m / 2) * 8));
  const uint32_t warp_pipe_address = shared_address(warp_pipe);

  // Rows g and g + 8 of this lane (padding rows take the last real row's position).
  WarpSoftmax softmax(p, row_position(p, b, row0 + min(g, rows - 1)), row_position(p, b, row0 + min(g + 8, rows - 1)),
                      lane);
  float o[kWidth / 8][4] = {};  // n-tile n: rows g, g + 8 x columns 8n + 2t, +1

  // Tiles that need a per-key mask: past the split's end, or not inside every row's causal window.
  const int unmasked_end = min(keys.key_end, keys.lowest + 1);
  const int unmasked_begin = p.mask.window_left < 0 ? 0 : keys.highest - static_cast<int>(p.mask.window_left);

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < warp_tiles) issue(s);
    else cp_async_commit();  // one group per tile keeps the wait's count right
  }

  // Q as A operands, loaded by the whole block while the first tiles are in flight. k-step s: {row g, row g + 8} x
  // {columns 16s + 2t, +1}, then the same at 16s + 8 + 2t.
  for (int index = threadIdx.x; index < Shape::kSteps * 32; index += Shape::kThreads) {
    const int s = index / 32, r = index % 32 / 4, col = 16 * s + 2 * (index % 4);
    const Element* q = static_cast<const Element*>(p.q);
    auto pair = [&](int row, int c) -> uint32_t {
      return row < rows && c < d ? *reinterpret_cast<const uint32_t*>(q + out_row(p, b, hk, row0 + row) * d + c) : 0u;
    };
    query_frags[index] = make_uint4(pair(r, col), pair(r + 8, col), pair(r, col + 8), pair(r + 8, col + 8));
  }
  __syncthreads();
  uint4 query[Shape::kSteps];  // in registers: read once, not once per tile
#pragma unroll
  for (int step = 0; step < Shape::kSteps; ++step) query[step] = query_frags[step * 32 + lane];

  for (int i = 0; i < warp_tiles; ++i) {
    __syncwarp();  // every lane has read tile i - 1, whose stage is refilled now
    if (i + kStages - 1 < warp_tiles) issue(i + kStages - 1);
    else cp_async_commit();
    // Tiles issued after i (or empty groups standing in for them) may stay in flight; other lanes' chunks of i become
    // visible at the warp barrier.
    cp_async_wait<kStages - 1>();
    __syncwarp();
    const uint32_t tile_address = warp_pipe_address + (i % kStages) * Shape::kTileElements * sizeof(Element);
    const int j0 = tile_start(i);

    float s[2][4] = {};
#pragma unroll
    for (int step = 0; step < Shape::kSteps; ++step) {
      uint32_t k[4];
      ldmatrix_x4(k, tile_address + k_lane + step * 32);
      mma_16816<Element>(s[0], query[step], k[0], k[1]);
      mma_16816<Element>(s[1], query[step], k[2], k[3]);
    }

    const bool masked = j0 + kTileRows > unmasked_end || j0 < unmasked_begin;
    const float2 rescale = softmax.update(s, j0, masked, keys.key_end);
    if (WarpSoftmax::any_moved(rescale)) {
#pragma unroll
      for (int n = 0; n < kWidth / 8; ++n) o[n][0] *= rescale.x, o[n][1] *= rescale.x, o[n][2] *= rescale.y,
                                           o[n][3] *= rescale.y;
    }
    const uint4 probs = probabilities_operand<Element>(s);
#pragma unroll
    for (int pair = 0; pair < Shape::kSteps; ++pair) {
      uint32_t v[4];
      ldmatrix_x4_trans(v, tile_address + v_lane + pair * 32);
      mma_16816<Element>(o[2 * pair], probs, v[0], v[1]);
      mma_16816<Element>(o[2 * pair + 1], probs, v[2], v[3]);
    }
  }
  cp_async_wait<0>();
  allow_dependent_launch();

  // The warps' states go to shared memory (over the drained pipeline) and are merged.
  softmax.reduce_sums();
  __syncthreads();
  softmax.store(&warp_max[0][0], &warp_sum[0][0], warp, g);
  // Rows past the block's real ones (padding of the 16 mma rows) are never read.
  constexpr int kMergeStride = Shape::kMergeStride;
  float* warp_o = merge_o + warp * kMmaRows * kMergeStride;
  const int t = lane % 4;
#pragma unroll
  for (int n = 0; n < kWidth / 8; ++n) {
    float* column = warp_o + 8 * n + 2 * t;
    if (g < rows) *reinterpret_cast<float2*>(column + g * kMergeStride) = make_float2(o[n][0], o[n][1]);
    if (g + 8 < rows) *reinterpret_cast<float2*>(column + (g + 8) * kMergeStride) = make_float2(o[n][2], o[n][3]);
  }
  __syncthreads();
  if (shape.cluster_combine) {
    __shared__ float split_lse[kMmaRows];
    merge_and_combine_in_cluster<Element, kWarps, kMmaRows, kWidth, kMergeStride>(
        p, block, rows, &warp_max[0][0], &warp_sum[0][0], merge_o, split_lse);
  } else {
    merge_and_store<Element, kWarps, kMmaRows, kWidth, kMergeStride>(p, parts, block, rows, &warp_max[0][0],
                                                                     &warp_sum[0][0], merge_o);
  }
}

}  // namespace jax_flash::cuda_kernels::decode
