// The fp16/bf16 split kernel with row tiles: each warp stages whole key rows of K and V in shared memory and reads
// its mma operands from them with ldmatrix. Staging rows in their global order is what lets a single instruction load
// a row: on sm_90 (kBulk) every lane of the warp moves one 256-byte K or V row with a 1-D bulk copy that completes on
// the stage's mbarrier, so a 16-key tile costs one copy instruction per lane instead of one per 16 bytes; elsewhere
// the same rows are filled by cp.async 16-byte chunks.
//
// * Packed rows (all query heads of one kv head at every new position, up to 16) are the M = 16 rows of m16n8k16, as
//   in the lanes kernel (decode_split_mma.cuh), and the online softmax is the same (decode_softmax.cuh).
// * Rows are padded by 16 bytes, so the 8 rows of an ldmatrix fall in distinct banks (no swizzle, which a row copy
//   could not apply). K is read as the "col" B operand of Q K^T directly, V transposed (ldmatrix.trans) for P V.
// * Each warp runs its own kStages-deep pipeline of 16-key tiles, with no block barrier until the end. Either the
//   warps share one kv head (tiles warp, warp + kWarps, ... of the split; their states are merged at the end), or
//   with kWarpPerHead each warp owns one of kWarps consecutive kv heads and walks all the split's tiles: the warps
//   then read the same keys of neighbouring heads (contiguous in the cache) at about the same time, which keeps
//   DRAM pages open, and each warp writes its own result.
// * The bulk path may also prefetch the rows of tiles beyond its stages into L2 (LaunchShape::prefetch_tiles), which
//   puts more bytes in flight than shared memory holds.
// * Keys past the split's end are masked; their V rows are zero (cp.async zero-fills them, the bulk path stores
//   zeros) so that a probability of 0 never meets stale bytes. Head-dim columns past head_dim are zero too.
#pragma once

#include <cmath>
#include <cstdint>

#include "decode_block.cuh"
#include "decode_bulk.cuh"
#include "decode_softmax.cuh"
#include "tensor_core/ptx.cuh"

namespace jax_flash::cuda_kernels::decode {

template <typename Element, int kWidth, int kWarps, int kStages, bool kWarpPerHead>
struct RowsKernel {
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kHeadsPerBlock = kWarpPerHead ? kWarps : 1;
  static constexpr int kRowStride = kWidth + 8;  // elements: the 16-byte pad staggers rows across banks
  static constexpr int kSteps = kWidth / 16;     // k-steps of Q K^T, and pairs of output n-tiles of P V
  static constexpr int kTileElements = 2 * kTileKeys * kRowStride;  // K rows, then V rows
  static constexpr size_t kQueryBytes = size_t{16} * kSteps * 32 * kHeadsPerBlock;  // Q operands of every head
  static constexpr size_t kPipeBytes = sizeof(Element) * kTileElements * kWarps * kStages;
  // Warps' outputs over the drained pipeline: all at its start, or each over its own stages.
  static constexpr size_t kMergeBytes = sizeof(float) * kWarps * 16 * kWidth;
  static_assert(sizeof(float) * 16 * kWidth <= sizeof(Element) * kTileElements * kStages, "a warp's output fits its stages");
  static constexpr size_t kSharedBytes = kQueryBytes + (kPipeBytes > kMergeBytes ? kPipeBytes : kMergeBytes);
  // Blocks that fit an sm_90 SM's 227 KiB (1 KiB reserved per block), for the register bound of __launch_bounds__.
  static constexpr int kMinBlocks = (227 * 1024) / (kSharedBytes + 2048) < 1 ? 1 : (227 * 1024) / (kSharedBytes + 2048);
};

template <typename Element, int kWidth, int kWarps, int kStages, bool kBulk, bool kWarpPerHead>
__global__ void __launch_bounds__(kWarps * 32, (RowsKernel<Element, kWidth, kWarps, kStages, kWarpPerHead>::kMinBlocks))
    decode_rows_kernel(DecodeParams p, LaunchShape shape, Partials parts) {
  using tensor_core::cp_async_16;
  using tensor_core::cp_async_commit;
  using tensor_core::cp_async_wait;
  using tensor_core::ldmatrix_x4;
  using tensor_core::ldmatrix_x4_trans;
  using tensor_core::mma_16816;
  using tensor_core::shared_address;
  using Shape = RowsKernel<Element, kWidth, kWarps, kStages, kWarpPerHead>;
  constexpr int kStride = Shape::kRowStride, kTileRows = kTileKeys;
  constexpr bool kUseBulk = kBulk && JAX_FLASH_DECODE_BULK;
  extern __shared__ uint4 shared[];
  uint4* query_frags = shared;  // [kHeadsPerBlock][kSteps][32]: A operands of Q
  Element* pipe = reinterpret_cast<Element*>(shared + Shape::kQueryBytes / 16);  // [kWarps][kStages][2][16][kStride]
  float* merge_o = reinterpret_cast<float*>(pipe);  // [kWarps][16][kWidth], once drained (warps sharing a head)
  __shared__ float warp_max[kWarps][16], warp_sum[kWarps][16];
#if JAX_FLASH_DECODE_BULK
  __shared__ uint64_t tile_ready[kWarps][kStages];  // bulk path: each stage's copies complete here
#endif

  const BlockIndex block = block_index(shape, kMmaRows);  // block.hk: the block's group of heads
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4;
  const int64_t hk = kWarpPerHead ? block.hk * kWarps + warp : block.hk, b = block.b;
  const bool has_head = hk < p.cache.heads_kv;  // the last group of heads may have fewer heads than warps
  const int row0 = block.row0;
  const int rows = min(kMmaRows, static_cast<int>(p.q_len * p.group()) - row0);
  const int d = static_cast<int>(p.cache.head_dim);
  const BlockKeys keys = block_keys(p, b, row0, rows, block.split, block.splits);

  const Element* k_cache = static_cast<const Element*>(p.k);
  const Element* v_cache = static_cast<const Element*>(p.v);
  const int64_t key_stride = p.cache.heads_kv * p.cache.head_dim;
  Element* warp_pipe = pipe + warp * kStages * Shape::kTileElements;
  const int tiles = (max(keys.key_end - keys.key_begin, 0) + kTileRows - 1) / kTileRows;
  const int warp_tiles = kWarpPerHead ? (has_head ? tiles : 0) : tiles > warp ? (tiles - warp - 1) / kWarps + 1 : 0;
  auto tile_start = [&](int i) { return keys.key_begin + (kWarpPerHead ? i : warp + i * kWarps) * kTileRows; };

  if constexpr (kUseBulk) {
#if JAX_FLASH_DECODE_BULK
    // Row copies never write the pad or the columns past head_dim: each warp zeroes its stages once, as K operands
    // must be. The fence orders these generic writes before the bulk copies that later overwrite head_dim columns.
    if (d < kWidth) {
      for (int i = lane; i < static_cast<int>(kStages * Shape::kTileElements * sizeof(Element) / 16); i += 32)
        reinterpret_cast<uint4*>(warp_pipe)[i] = make_uint4(0, 0, 0, 0);
      fence_proxy_async();
    }
    if (lane == 0) {
      for (int s = 0; s < kStages; ++s) mbarrier_init(shared_address(&tile_ready[warp][s]), 1);
      mbarrier_init_fence();
    }
    __syncwarp();
#endif
  }

  // Tile i goes to stage i % kStages: rows 0-15 K of keys j0.., rows 16-31 V.
  auto issue = [&](int i) {
    const int j0 = tile_start(i);
    const int64_t base = tile_offset(p.cache, b, j0, hk);
    const int valid_keys = min(kTileRows, keys.key_end - j0);
    Element* tile = warp_pipe + (i % kStages) * Shape::kTileElements;
    if constexpr (kUseBulk) {
#if JAX_FLASH_DECODE_BULK
      // Lane l < 16 copies K row l, lane 16 + l V row l. The expected bytes are announced before any copy lands.
      const uint32_t barrier = shared_address(&tile_ready[warp][i % kStages]);
      const uint32_t row_bytes = static_cast<uint32_t>(d * sizeof(Element));
      if (lane == 0) mbarrier_arrive_expect(barrier, 2 * valid_keys * row_bytes);
      __syncwarp();
      const int key = lane % kTileRows;
      Element* row = tile + lane * kStride;
      if (key < valid_keys) {
        fence_proxy_async();  // this stage's last ldmatrix reads come before the copy's writes
        bulk_copy(shared_address(row), (lane < kTileRows ? k_cache : v_cache) + base + key * key_stride, row_bytes,
                  barrier);
      } else if (lane >= kTileRows) {
#pragma unroll
        for (int c = 0; c < kWidth / 8; ++c) reinterpret_cast<uint4*>(row)[c] = make_uint4(0, 0, 0, 0);
      }
#endif
    } else {
      // 16 lanes cover a row of 16-byte chunks at width 128; every chunk past the keys or head_dim is zero-filled.
      constexpr int kChunks = kWidth / 8;
#pragma unroll
      for (int u = 0; u < 2 * kTileRows * kChunks / 32; ++u) {
        const int index = u * 32 + lane, row = index / kChunks, col = index % kChunks * 8, key = row % kTileRows;
        const Element* cache = row < kTileRows ? k_cache : v_cache;
        const bool valid = key < valid_keys && col < d;
        cp_async_16(shared_address(tile + row * kStride + col), valid ? cache + base + key * key_stride + col : cache,
                    valid);
      }
      cp_async_commit();
    }
  };
  auto wait_for = [&](int i) {
    if constexpr (kUseBulk) {
#if JAX_FLASH_DECODE_BULK
      mbarrier_wait(shared_address(&tile_ready[warp][i % kStages]), (i / kStages) % 2);
#endif
    } else {
      // Tiles issued after i (or empty groups standing in for them) may stay in flight; other lanes' chunks of i
      // become visible at the warp barrier.
      cp_async_wait<kStages - 1>();
      __syncwarp();
    }
  };
  // Bulk path: tile i's rows into L2 only (no stage, nothing to wait for), so that more bytes are in flight than the
  // stages hold; the tile's bulk copies later find them there.
  const int prefetch_tiles = kUseBulk ? shape.prefetch_tiles : 0;
  auto prefetch = [&](int i) {
#if JAX_FLASH_DECODE_BULK
    const int j0 = tile_start(i), key = lane % kTileRows;
    if (key < min(kTileRows, keys.key_end - j0))
      bulk_prefetch_l2((lane < kTileRows ? k_cache : v_cache) + tile_offset(p.cache, b, j0, hk) + key * key_stride,
                       static_cast<uint32_t>(d * sizeof(Element)));
#endif
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
    else if constexpr (!kUseBulk) cp_async_commit();  // one group per tile keeps wait_for's count right
  }
  for (int i = kStages - 1; i < min(kStages - 1 + prefetch_tiles, warp_tiles); ++i) prefetch(i);

  // Q as A operands, loaded while the first tiles are in flight. k-step s: {row g, row g + 8} x {columns 16s + 2t,
  // +1}, then the same at 16s + 8 + 2t. Each warp loads its own head's, or all threads the block's one head's.
  uint4* head_query = query_frags + (kWarpPerHead ? warp * Shape::kSteps * 32 : 0);
  const int q_thread = kWarpPerHead ? lane : threadIdx.x, q_threads = kWarpPerHead ? 32 : Shape::kThreads;
  for (int index = q_thread; has_head && index < Shape::kSteps * 32; index += q_threads) {
    const int s = index / 32, r = index % 32 / 4, col = 16 * s + 2 * (index % 4);
    const Element* q = static_cast<const Element*>(p.q);
    auto pair = [&](int row, int c) -> uint32_t {
      return row < rows && c < d ? *reinterpret_cast<const uint32_t*>(q + out_row(p, b, hk, row0 + row) * d + c) : 0u;
    };
    head_query[index] = make_uint4(pair(r, col), pair(r + 8, col), pair(r, col + 8), pair(r + 8, col + 8));
  }
  __syncthreads();

  for (int i = 0; i < warp_tiles; ++i) {
    __syncwarp();  // every lane has read tile i - 1, whose stage is refilled now
    if (i + kStages - 1 < warp_tiles) issue(i + kStages - 1);
    else if constexpr (!kUseBulk) cp_async_commit();
    if (prefetch_tiles > 0 && i + kStages - 1 + prefetch_tiles < warp_tiles) prefetch(i + kStages - 1 + prefetch_tiles);
    wait_for(i);
    const uint32_t tile_address = warp_pipe_address + (i % kStages) * Shape::kTileElements * sizeof(Element);
    const int j0 = tile_start(i);

    float s[2][4] = {};
#pragma unroll
    for (int step = 0; step < Shape::kSteps; ++step) {
      uint32_t k[4];
      ldmatrix_x4(k, tile_address + k_lane + step * 32);
      const uint4 a = head_query[step * 32 + lane];
      mma_16816<Element>(s[0], a, k[0], k[1]);
      mma_16816<Element>(s[1], a, k[2], k[3]);
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
  if constexpr (!kUseBulk) cp_async_wait<0>();
  allow_dependent_launch();

  softmax.reduce_sums();
  const int t = lane % 4;
  // This warp's output rows as merge_and_store reads them: [16][kWidth] floats.
  auto store_output = [&](float* warp_o) {
#pragma unroll
    for (int n = 0; n < kWidth / 8; ++n)
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        warp_o[g * kWidth + 8 * n + 2 * t + x] = o[n][x];
        warp_o[(g + 8) * kWidth + 8 * n + 2 * t + x] = o[n][2 + x];
      }
  };
  if constexpr (kWarpPerHead) {
    // The warp's state is its head's whole split: it writes the result alone, staged over its own drained stages.
    if (!has_head) return;
    __syncwarp();
    softmax.store(&warp_max[0][0], &warp_sum[0][0], warp, g);
    float* warp_o = reinterpret_cast<float*>(warp_pipe);
    store_output(warp_o);
    __syncwarp();
    BlockIndex head_block = block;
    head_block.hk = hk;
    merge_and_store<Element, 1, kMmaRows, kWidth>(p, parts, head_block, rows, &warp_max[warp][0], &warp_sum[warp][0],
                                                  warp_o, lane, 32);
  } else {
    // The warps' states go to shared memory (over the drained pipeline) and are merged.
    __syncthreads();
    softmax.store(&warp_max[0][0], &warp_sum[0][0], warp, g);
    store_output(merge_o + warp * 16 * kWidth);
    __syncthreads();
    merge_and_store<Element, kWarps, kMmaRows, kWidth>(p, parts, block, rows, &warp_max[0][0], &warp_sum[0][0], merge_o,
                                                       threadIdx.x, blockDim.x);
  }
}

}  // namespace jax_flash::cuda_kernels::decode
