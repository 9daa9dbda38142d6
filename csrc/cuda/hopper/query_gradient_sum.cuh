// The fused Hopper backward's dQ (backward_kernel.cuh, role kFused): a float32 sum shaped like dq,
// [batch, seqlen_q, heads_q, head_dim], in the workspace after the per-row inputs. It is zeroed on the stream, the
// key-major kernel adds every (key block, query tile) product dS K into it with atomics, and a last kernel scales
// it by the softmax scale and rounds it into dq. The order of the atomic additions varies from run to run, so the
// fused backward serves calls that do not ask for determinism; the two-kernel backward is bitwise deterministic.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "../../attention_params.h"

namespace jax_flash::cuda_kernels::hopper {

// The head dims whose backward configuration has a fused form (one key pass, 64-query streamed tiles).
inline bool fused_backward_compiled_for(int64_t head_dim) { return head_dim <= 128; }

inline size_t query_gradient_sum_bytes(const AttentionShape& s) {
  return sizeof(float) * size_t(s.batch * s.seqlen_q * s.heads_q * s.head_dim);
}

// Where the sum starts after `rows_bytes` of per-row inputs, and what the workspace needs for it.
inline size_t query_gradient_sum_offset(size_t rows_bytes) { return (rows_bytes + 255) / 256 * 256; }
inline size_t query_gradient_sum_workspace_bytes(const AttentionShape& s, size_t rows_bytes) {
  return fused_backward_compiled_for(s.head_dim)
             ? query_gradient_sum_offset(rows_bytes) - rows_bytes + query_gradient_sum_bytes(s)
             : 0;
}

// dq = scale * sum, two elements per thread and step (head_dim is even).
template <typename Element>
__global__ void round_query_gradient_kernel(const float2* sum, Element* dq, int64_t pairs, float scale) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < pairs; i += int64_t(gridDim.x) * blockDim.x) {
    const float2 value = sum[i];
    dq[2 * i] = Element(value.x * scale);
    dq[2 * i + 1] = Element(value.y * scale);
  }
}

template <typename Element>
cudaError_t launch_round_query_gradient(const float* sum, void* dq, const AttentionShape& s, float scale,
                                        cudaStream_t stream) {
  const int64_t pairs = int64_t(query_gradient_sum_bytes(s) / sizeof(float2));
  if (pairs == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const int64_t blocks = (pairs + kThreads - 1) / kThreads;
  round_query_gradient_kernel<Element><<<unsigned(blocks < 65536 ? blocks : 65536), kThreads, 0, stream>>>(
      reinterpret_cast<const float2*>(sum), static_cast<Element*>(dq), pairs, scale);
  return cudaGetLastError();
}

}  // namespace jax_flash::cuda_kernels::hopper
