// Host side of the Hopper forward: builds the TMA descriptors for this call's tensors and launches the persistent
// kernel, one CTA per SM. Included only by the generated instantiation files, which compile for sm_90a.
#pragma once

#include <cmath>
#include <cstdint>

#include <cuda_runtime.h>

#include "../../attention_params.h"
#include "../device_attribute.h"
#include "forward_kernel.cuh"
#include "fp8_value_transpose.cuh"
#include "hopper.h"

namespace jax_flash::cuda_kernels::hopper {

// Whether a call's query rows hold several documents (segment ids, or positions that restart): then a query tile
// that straddles a boundary masks every key tile of the earlier document element by element.
inline bool has_document_boundaries(const TokenMask& tokens) {
  return tokens.q_segment_ids != nullptr || tokens.q_positions != nullptr;
}

template <class Config>
cudaError_t launch_forward_config(const AttentionForwardParams& params, void* workspace, cudaStream_t stream) {
  using Element = typename Config::Element;
  const AttentionShape& s = params.shape;
  if (s.batch == 0 || s.heads_q == 0 || s.seqlen_q == 0) return cudaSuccess;
  // A TMA descriptor cannot describe an empty tensor; the sm80 kernels handle calls without keys.
  if (s.seqlen_k == 0) return cudaErrorNotSupported;
  ForwardKernelParams<Config> p{};
  p.shape_q = GlobalShape(int32_t(s.seqlen_q), int32_t(s.head_dim), int32_t(s.heads_q), int32_t(s.batch));
  p.shape_kv = GlobalShape(int32_t(s.seqlen_k), int32_t(s.head_dim), int32_t(s.heads_kv), int32_t(s.batch));
  // Boxes past the sequence end or past head_dim (a smaller head dim in this bucket) load as zeros.
  p.tma_q = make_tma_copy(SM90_TMA_LOAD{}, global_tensor<Element>(params.q, p.shape_q),
                          typename Config::SmemLayoutQ{});
  p.tma_k = make_tma_copy(SM90_TMA_LOAD{}, global_tensor<Element>(params.k, p.shape_kv),
                          take<0, 2>(typename Config::SmemLayoutK{}));
  if constexpr (Config::kFp8) {
    // v goes transposed into the workspace, past the work counter (fp8_value_transpose.cuh).
    void* vt = static_cast<char*>(workspace) + kFp8ValueOffset;
    if (cudaError_t status = launch_transpose_value_fp8<Config::kHeadDim>(params.v, vt, s.batch, s.seqlen_k,
                                                                          s.heads_kv, s.head_dim, stream);
        status != cudaSuccess)
      return status;
    p.shape_vt = GlobalShape(int32_t(s.head_dim), int32_t(fp8_padded_keys(s.seqlen_k)), int32_t(s.heads_kv),
                             int32_t(s.batch));
    p.tma_v = make_tma_copy(SM90_TMA_LOAD{}, global_transposed_tensor<Element>(vt, p.shape_vt),
                            take<0, 2>(typename Config::SmemLayoutV{}));
    p.descale = params.descale;
  } else {
    p.tma_v = make_tma_copy(SM90_TMA_LOAD{}, global_tensor<Element>(params.v, p.shape_kv),
                            take<0, 2>(typename Config::SmemLayoutV{}));
  }
  if constexpr (Config::kStagedOutput) {
    p.tma_output = make_tma_copy(SM90_TMA_STORE{}, global_tensor<typename Config::Output>(params.out, p.shape_q),
                                 typename Config::SmemLayoutOutput{});
  }
  p.out = params.out;
  p.lse = params.lse;
  p.seqlen_q = int(s.seqlen_q);
  p.seqlen_k = int(s.seqlen_k);
  p.heads_q = int(s.heads_q);
  p.group = int(s.group());
  p.head_dim = int(s.head_dim);
  p.mask = params.mask;
  p.tokens = params.tokens;
  p.has_tokens = params.tokens.any();
  p.scale = params.scale;
  p.scale_log2 = float(M_LOG2E) * (params.mask.softcap > 0.f ? 1.f : params.scale);
  const int64_t m_blocks = (s.seqlen_q + Config::kBlockM - 1) / Config::kBlockM;
  // Work indices travel in tickets with a flag bit; the sm80 kernels take calls with more tiles.
  if (m_blocks * s.heads_q * s.batch >= (int64_t{1} << 30)) return cudaErrorNotSupported;
  // The last query tiles see the most keys under a causal mask: they go first.
  p.order = WorkOrder{int(m_blocks), int(s.heads_q), int(s.batch), params.mask.window_right >= 0};
  p.work_counter = static_cast<int*>(workspace);
  // Timed on the H200 (docs/benchmarks.md): within 1% either way, slightly ahead at head dims 64 and 128.
  p.pingpong = Config::kHeadDim <= 128;

  int sm_count = 0;
  if (cudaError_t status = device_attribute<cudaDevAttrMultiProcessorCount>(&sm_count); status != cudaSuccess)
    return status;
  const int64_t tiles = m_blocks * s.heads_q * s.batch;
  const dim3 grid(unsigned(tiles < sm_count ? tiles : sm_count));
  if (cudaError_t status = cudaMemsetAsync(p.work_counter, 0, sizeof(int), stream); status != cudaSuccess)
    return status;
  auto* kernel = &forward_kernel<Config>;
  // Set per launch: the attribute belongs to the current device, and a process may drive several.
  cudaError_t status =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Config::kSmemBytes);
  if (status != cudaSuccess) return status;
  kernel<<<grid, Config::kThreads, Config::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace jax_flash::cuda_kernels::hopper
