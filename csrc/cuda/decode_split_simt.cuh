// The float32 split kernel, on CUDA cores (the tensor-core kernel takes the 16-bit types; float32 inputs keep full
// float32 products). A "slot" of kLanes lanes holds one key row (each lane kChunks 16-byte chunks), computes the
// logits of all packed rows with a butterfly reduction over its lanes and keeps its own online softmax, so slots never
// wait for each other; the slots' states are merged once, in shared memory, at the end of the split.
#pragma once

#include <cmath>
#include <cstdint>

#include "decode_block.cuh"

namespace jax_flash::cuda_kernels::decode {

constexpr int kSimtThreads = 128;
constexpr int kSimtUnroll = 2;  // keys per slot loaded before any is used, for memory-level parallelism

// The explicit minimum of one block per SM stops ptxas (sm_80) from capping registers at 128 and spilling.
template <int kLanes, int kChunks, int kRows>
__global__ void __launch_bounds__(kSimtThreads, 1) decode_simt_kernel(DecodeParams p, LaunchShape shape,
                                                                       Partials parts) {
  constexpr int kElems = 4;  // floats per 16-byte chunk
  constexpr int kSlots = kSimtThreads / kLanes;
  constexpr int kWidth = kLanes * kChunks * kElems;  // columns covered by a slot, >= head_dim

  const BlockIndex block = block_index(shape, kRows);
  const int64_t hk = block.hk, b = block.b;
  const int row0 = block.row0;
  const int rows = min(kRows, static_cast<int>(p.q_len * p.group()) - row0);
  const int64_t d = p.cache.head_dim;
  const int lane = threadIdx.x % 32, sub = lane % kLanes, slot = static_cast<int>(threadIdx.x) / kLanes;
  const BlockKeys keys = block_keys(p, b, row0, rows, block.split, block.splits);

  // Rows' queries (pre-scaled) and positions; rows past `rows` compute on zeros and are dropped.
  float q[kRows][kChunks][kElems];
  int position[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int row = row0 + min(r, rows - 1);
    position[r] = row_position(p, b, row);
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int64_t col = (c * kLanes + sub) * kElems;
      float values[kElems] = {};
      if (r < rows && col < d)
        chunk_to_float(load_chunk(static_cast<const float*>(p.q) + out_row(p, b, hk, row) * d + col), values);
#pragma unroll
      for (int e = 0; e < kElems; ++e) q[r][c][e] = values[e] * p.scale;
    }
  }

  float o[kRows][kChunks][kElems] = {};
  float row_max[kRows], row_sum[kRows];  // base-2 running max and sum of this slot
#pragma unroll
  for (int r = 0; r < kRows; ++r) row_max[r] = -INFINITY, row_sum[r] = 0.f;

  const float* k_base = static_cast<const float*>(p.k);
  const float* v_base = static_cast<const float*>(p.v);
  const int key_end = keys.key_end;
  // Every lane runs the same number of iterations (shuffles need the whole warp); missing keys are masked.
  for (int j0 = keys.key_begin; j0 < key_end; j0 += kSlots * kSimtUnroll) {
    uint4 k_raw[kSimtUnroll][kChunks], v_raw[kSimtUnroll][kChunks];
#pragma unroll
    for (int u = 0; u < kSimtUnroll; ++u) {
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
    for (int u = 0; u < kSimtUnroll; ++u) {
      const int j = j0 + u * kSlots + slot;
      float k[kChunks][kElems], v[kChunks][kElems];
#pragma unroll
      for (int c = 0; c < kChunks; ++c) chunk_to_float(k_raw[u][c], k[c]), chunk_to_float(v_raw[u][c], v[c]);
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

  allow_dependent_launch();

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
  merge_and_store<float, kSlots, kRows, kWidth, kWidth>(p, parts, block, rows, &slot_max[0][0], &slot_sum[0][0],
                                                        &slot_o[0][0][0]);
}

}  // namespace jax_flash::cuda_kernels::decode
