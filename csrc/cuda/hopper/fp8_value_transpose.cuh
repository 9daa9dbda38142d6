// The FP8 forward's first step: v [batch, seqlen_k, heads_kv, head_dim] (e4m3) to vt [batch, heads_kv, head_dim,
// keys_padded] with keys contiguous, as the 8-bit wgmma needs its B operand (K-major only), and permuted within every
// 32-key block into the order the P operand's registers hold them in (fp8_operand.cuh). Keys from seqlen_k to
// keys_padded (seqlen_k rounded up to 32) are zeros, so no NaN pattern in a cache's unused rows can reach P V.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "fp8_operand.cuh"
#include "hopper.h"

namespace jax_flash::cuda_kernels::hopper {

constexpr int kTransposeKeys = 64;  // keys per block: two permutation blocks

// One block per (64 keys, kv head, batch row): 4-byte loads of whole key rows into shared memory, then 4-byte stores
// of four permuted keys per head_dim row. head_dim is a multiple of 16 (the TMA's stride rule for the other tensors).
template <int kHeadDim>
__global__ void __launch_bounds__(256) transpose_value_fp8(const uint8_t* __restrict__ v, uint8_t* __restrict__ vt,
                                                           int seqlen_k, int keys_padded, int heads_kv,
                                                           int head_dim) {
  __shared__ uint8_t tile[kTransposeKeys][kHeadDim + 4];  // +4 bytes: a row's column reads fall on distinct banks
  const int key0 = blockIdx.x * kTransposeKeys, head = blockIdx.y, batch = blockIdx.z;
  const int row_words = head_dim / 4;
  for (int i = threadIdx.x; i < kTransposeKeys * row_words; i += blockDim.x) {
    const int key = i / row_words, word = i % row_words;
    uint32_t value = 0;
    if (key0 + key < seqlen_k) {
      value = *reinterpret_cast<const uint32_t*>(
          v + ((int64_t(batch) * seqlen_k + key0 + key) * heads_kv + head) * head_dim + 4 * word);
    }
    *reinterpret_cast<uint32_t*>(&tile[key][4 * word]) = value;
  }
  __syncthreads();
  constexpr int kSlotWords = kTransposeKeys / 4;
  for (int i = threadIdx.x; i < head_dim * kSlotWords; i += blockDim.x) {
    const int d = i / kSlotWords, slot = 4 * (i % kSlotWords);
    if (key0 + slot >= keys_padded) continue;
    const int block = slot / 32 * 32;
    uint32_t packed = 0;
#pragma unroll
    for (int b = 0; b < 4; ++b) packed |= uint32_t(tile[block + fp8_operand_key(slot % 32 + b)][d]) << (8 * b);
    *reinterpret_cast<uint32_t*>(vt + ((int64_t(batch) * heads_kv + head) * head_dim + d) * keys_padded + key0 +
                                 slot) = packed;
  }
}

template <int kHeadDim>
cudaError_t launch_transpose_value_fp8(const void* v, void* vt, int64_t batch, int64_t seqlen_k, int64_t heads_kv,
                                       int64_t head_dim, cudaStream_t stream) {
  if (heads_kv > 65535 || batch > 65535) return cudaErrorInvalidValue;  // grid y and z
  const int64_t keys_padded = fp8_padded_keys(seqlen_k);
  const dim3 grid(unsigned((keys_padded + kTransposeKeys - 1) / kTransposeKeys), unsigned(heads_kv),
                  unsigned(batch));
  transpose_value_fp8<kHeadDim><<<grid, 256, 0, stream>>>(static_cast<const uint8_t*>(v), static_cast<uint8_t*>(vt),
                                                          int(seqlen_k), int(keys_padded), int(heads_kv),
                                                          int(head_dim));
  return cudaGetLastError();
}

}  // namespace jax_flash::cuda_kernels::hopper
