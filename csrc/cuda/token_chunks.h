// The per-call summary of a TokenMask's inputs, one TokenChunk (attention_params.h) per kTokenChunk tokens of each
// batch row of each side. Kernels classify a tile of tokens (empty, partial or full against another tile) from its
// few chunks, instead of every block rescanning the tile's ids: that rescan was most of the sm80 token kernels' time.
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

#include "../attention_params.h"

namespace jax_flash::cuda_kernels {

// Device bytes the summaries of both sides take: 0 without a token mask.
size_t token_chunks_bytes(const AttentionShape& shape, const TokenMask& tokens);

// Summarizes both sides into `workspace` (token_chunks_bytes of it, 16-byte aligned) on `stream` and points
// tokens->q_chunks and tokens->kv_chunks there. Does nothing without a token mask.
cudaError_t summarize_token_chunks(const AttentionShape& shape, TokenMask* tokens, void* workspace,
                                   cudaStream_t stream);

}  // namespace jax_flash::cuda_kernels
