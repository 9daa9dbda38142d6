// One warp per chunk: a lane per token, so the ids are read once, coalesced, and reduced with warp min/max.
#include "token_chunks.h"

#include <climits>
#include <cstdint>

namespace jax_flash::cuda_kernels {
namespace {

constexpr int kWarpsPerBlock = 8;
static_assert(kTokenChunk == 32, "a chunk is one token per lane of a warp");

int64_t chunks_per_row(int64_t seq) { return (seq + kTokenChunk - 1) / kTokenChunk; }

// One side (queries or keys/values) of the mask.
struct Side {
  const int32_t* lengths;
  const int32_t* segment_ids;
  const int32_t* positions;
  int64_t seq, chunks;  // tokens and chunks per batch row
  TokenChunk* out;
};

__global__ void summarize_kernel(Side queries, Side keys, int64_t batch) {
  const int64_t warp = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int64_t query_chunks = batch * queries.chunks;
  if (warp >= query_chunks + batch * keys.chunks) return;  // a whole warp leaves together
  const bool is_query = warp < query_chunks;
  const Side& side = is_query ? queries : keys;
  const int64_t index = is_query ? warp : warp - query_chunks;
  const int64_t b = index / side.chunks, chunk = index % side.chunks;
  const int64_t token = chunk * kTokenChunk + threadIdx.x % 32;
  const int64_t live = side.lengths && side.lengths[b] < side.seq ? side.lengths[b] : side.seq;
  const bool is_live = token < live;  // a negative length leaves no token live
  const int64_t at = b * side.seq + token;
  const int segment = is_live && side.segment_ids ? side.segment_ids[at] : 0;
  const int position = is_live && side.positions ? side.positions[at] : int(token);
  TokenChunk summary;
  summary.segment_min = __reduce_min_sync(0xffffffffu, is_live ? segment : INT_MAX);
  summary.segment_max = __reduce_max_sync(0xffffffffu, is_live ? segment : INT_MIN);
  summary.position_min = __reduce_min_sync(0xffffffffu, is_live ? position : INT_MAX);
  summary.position_max = __reduce_max_sync(0xffffffffu, is_live ? position : INT_MIN);
  if (threadIdx.x % 32 == 0) side.out[index] = summary;
}

}  // namespace

size_t token_chunks_bytes(const AttentionShape& shape, const TokenMask& tokens) {
  if (!tokens.any()) return 0;
  return size_t(shape.batch) * size_t(chunks_per_row(shape.seqlen_q) + chunks_per_row(shape.seqlen_k)) *
         sizeof(TokenChunk);
}

cudaError_t summarize_token_chunks(const AttentionShape& shape, TokenMask* tokens, void* workspace,
                                   cudaStream_t stream) {
  if (!tokens->any()) return cudaSuccess;
  auto* chunks = static_cast<TokenChunk*>(workspace);
  const Side queries{tokens->q_lengths, tokens->q_segment_ids, tokens->q_positions, shape.seqlen_q,
                     chunks_per_row(shape.seqlen_q), chunks};
  const Side keys{tokens->kv_lengths, tokens->kv_segment_ids, tokens->kv_positions, shape.seqlen_k,
                  chunks_per_row(shape.seqlen_k), chunks + shape.batch * queries.chunks};
  tokens->q_chunks = queries.out;
  tokens->kv_chunks = keys.out;
  const int64_t warps = shape.batch * (queries.chunks + keys.chunks);
  if (warps == 0) return cudaSuccess;
  const int64_t blocks = (warps + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (blocks > INT_MAX) return cudaErrorInvalidValue;
  summarize_kernel<<<unsigned(blocks), 32 * kWarpsPerBlock, 0, stream>>>(queries, keys, shape.batch);
  return cudaGetLastError();
}

}  // namespace jax_flash::cuda_kernels
