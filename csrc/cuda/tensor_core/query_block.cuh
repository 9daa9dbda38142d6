// The work of one block of a query-major kernel (the forward and the dq backward): which query rows of which
// (batch, head) it owns, where they and their kv head start in memory, and the key blocks they can see.
#pragma once

#include <cstdint>

#include "../../attention_mask.h"
#include "../../attention_params.h"

namespace jax_flash::cuda_kernels::tensor_core {

struct QueryBlock {
  int64_t batch;
  int64_t head;
  int64_t row_begin;
  int64_t rows;        // rows of the block that exist (the last block of a sequence may be short)
  int64_t q_offset;    // element offset of row row_begin of this head in q, out, dout, dq
  int64_t kv_offset;   // element offset of key 0 of the kv head in k, v
  int64_t key_blocks_begin;  // the visible key blocks of kBlockN keys are [key_blocks_begin, key_blocks_end)
  int64_t key_blocks_end;
};

__host__ __device__ __forceinline__ int64_t query_blocks(const AttentionShape& shape, int block_m) {
  return (shape.seqlen_q + block_m - 1) / block_m * shape.heads_q * shape.batch;
}

// Blocks of one (batch, head) are adjacent, so they share k and v in L2; within a head the last query blocks go
// first because under a causal mask they see the most keys.
template <int kBlockM, int kBlockN>
__device__ __forceinline__ QueryBlock query_block(const AttentionShape& shape, const AttentionMask& mask) {
  const int64_t m_blocks = (shape.seqlen_q + kBlockM - 1) / kBlockM;
  const int64_t block = blockIdx.x;
  QueryBlock b;
  b.head = block / m_blocks % shape.heads_q;
  b.batch = block / (m_blocks * shape.heads_q);
  b.row_begin = (m_blocks - 1 - block % m_blocks) * kBlockM;
  b.rows = shape.seqlen_q - b.row_begin < kBlockM ? shape.seqlen_q - b.row_begin : kBlockM;
  const int64_t kv_head = b.head / (shape.heads_q / shape.heads_kv);
  b.q_offset = ((b.batch * shape.seqlen_q + b.row_begin) * shape.heads_q + b.head) * shape.head_dim;
  b.kv_offset = (b.batch * shape.seqlen_k * shape.heads_kv + kv_head) * shape.head_dim;
  const int64_t key_begin = first_visible_key(mask, b.row_begin);
  const int64_t key_end = end_visible_key(mask, b.row_begin + b.rows, shape.seqlen_k);
  b.key_blocks_begin = key_begin / kBlockN;
  b.key_blocks_end = key_end > key_begin ? (key_end + kBlockN - 1) / kBlockN : b.key_blocks_begin;
  return b;
}

}  // namespace jax_flash::cuda_kernels::tensor_core
