// Building blocks of the simple kernels. A warp keeps one head_dim-long row in registers, spread over its lanes
// (lane owns dims lane, lane + 32, ...), and the block stages tiles of rows of other tensors in shared memory as
// float32. Both layouts put consecutive lanes on consecutive dims, so global loads coalesce and shared-memory reads
// are free of bank conflicts.
#pragma once

#include <cstdint>

#include "dtype_traits.cuh"

namespace jax_flash::cuda_kernels {

constexpr int kWarpSize = 32;
constexpr unsigned kFullWarp = 0xffffffffu;

// Head dims each lane owns when rows are at most kMaxHeadDim long.
template <int kMaxHeadDim>
constexpr int kDimsPerLane = kMaxHeadDim / kWarpSize;

// Rows per shared-memory tile. A kernel stages two float tiles at once: 32 rows of up to 128 dims or 16 rows of up
// to 256 dims keep both within 32 KB, under the 48 KB of static shared memory a block gets without opting in.
// A tile never has more rows than a warp has lanes, so lane t can hold the result that belongs to tile row t.
template <int kMaxHeadDim>
constexpr int kTileRows = kMaxHeadDim <= 128 ? 32 : 16;

template <typename T>
__device__ __forceinline__ T warp_sum(T x) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(kFullWarp, x, offset);
  return x;
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(kFullWarp, x, offset));
  return x;
}

__device__ __forceinline__ int lane_id() { return static_cast<int>(threadIdx.x) % kWarpSize; }

// Element offsets in a contiguous [batch, seq, heads, head_dim] tensor.
struct SeqLayout {
  int64_t seqlen;
  int64_t heads;
  int64_t head_dim;

  __device__ __forceinline__ int64_t row(int64_t batch, int64_t position, int64_t head) const {
    return ((batch * seqlen + position) * heads + head) * head_dim;
  }
};

// Reads this lane's dims of `row`; dims past head_dim read as 0 so they add nothing to dot products.
template <int kDims, typename Element>
__device__ __forceinline__ void load_lane_row(const Element* row, int head_dim, float (&dims)[kDims]) {
#pragma unroll
  for (int slot = 0; slot < kDims; ++slot) {
    const int d = slot * kWarpSize + lane_id();
    dims[slot] = d < head_dim ? to_float(row[d]) : 0.f;
  }
}

template <int kDims, typename Element>
__device__ __forceinline__ void store_lane_row(Element* row, int head_dim, const float (&dims)[kDims], float factor) {
#pragma unroll
  for (int slot = 0; slot < kDims; ++slot) {
    const int d = slot * kWarpSize + lane_id();
    if (d < head_dim) row[d] = from_float<Element>(dims[slot] * factor);
  }
}

// This lane's share of dot(row held by the warp, tile_row), summed in Accum; warp_sum of it is the full dot
// product. In double, each product of two floats is exact, so the result depends only on the operands and this
// fixed order of summation.
template <typename Accum, int kDims>
__device__ __forceinline__ Accum lane_dot(const float (&dims)[kDims], const float* tile_row, int head_dim) {
  Accum partial = 0;
#pragma unroll
  for (int slot = 0; slot < kDims; ++slot) {
    const int d = slot * kWarpSize + lane_id();
    if (d < head_dim) partial += Accum(dims[slot]) * Accum(tile_row[d]);
  }
  return partial;
}

// dims += weight * tile_row, over this lane's dims.
template <int kDims>
__device__ __forceinline__ void lane_axpy(float (&dims)[kDims], float weight, const float* tile_row, int head_dim) {
#pragma unroll
  for (int slot = 0; slot < kDims; ++slot) {
    const int d = slot * kWarpSize + lane_id();
    if (d < head_dim) dims[slot] += weight * tile_row[d];
  }
}

// Dot products of the warp's row with each row of a tile, summed in Accum and handed out transposed: lane t returns
// the one with tile row t (lanes past kRows return 0).
template <int kRows, typename Accum = float, int kDims>
__device__ __forceinline__ Accum dot_with_tile_rows(const float (&dims)[kDims], const float* tile, int head_dim) {
  Accum mine = 0;
  // Unrolled only partly, here and below: a full unroll keeps too many tile values in registers at once.
#pragma unroll 4
  for (int t = 0; t < kRows; ++t) {
    const Accum dot = warp_sum(lane_dot<Accum>(dims, tile + t * head_dim, head_dim));
    if (lane_id() == t) mine = dot;
  }
  return mine;
}

// dims += sum over tile rows t of (lane t's weight) * tile row t: the transpose of dot_with_tile_rows.
template <int kRows, int kDims>
__device__ __forceinline__ void accumulate_tile_rows(float (&dims)[kDims], float lane_weight, const float* tile,
                                                     int head_dim) {
#pragma unroll 4
  for (int t = 0; t < kRows; ++t) {
    lane_axpy(dims, __shfl_sync(kFullWarp, lane_weight, t), tile + t * head_dim, head_dim);
  }
}

// Copies rows [first, first + kRows) of one (batch, head) of `tensor` into `tile` as floats, tile row t at
// tile + t * head_dim. Rows at or past `end` become zeros, so the products they feed (masked to weight 0) stay
// finite. Every thread of the block takes part; head_dim must be a multiple of 8.
template <int kRows, typename Element>
__device__ __forceinline__ void stage_tile(float* tile, const Element* tensor, const SeqLayout& layout, int64_t batch,
                                           int64_t head, int64_t first, int64_t end) {
  const int head_dim = static_cast<int>(layout.head_dim);
  const int chunks_per_row = head_dim / 8;
  for (int chunk = threadIdx.x; chunk < kRows * chunks_per_row; chunk += blockDim.x) {
    const int tile_row = chunk / chunks_per_row;
    const int d = (chunk % chunks_per_row) * 8;
    float values[8] = {};
    if (first + tile_row < end) load8_as_float(tensor + layout.row(batch, first + tile_row, head) + d, values);
    float4* dst = reinterpret_cast<float4*>(tile + tile_row * head_dim + d);
    dst[0] = make_float4(values[0], values[1], values[2], values[3]);
    dst[1] = make_float4(values[4], values[5], values[6], values[7]);
  }
}

}  // namespace jax_flash::cuda_kernels
