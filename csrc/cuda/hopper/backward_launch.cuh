// Host side of the Hopper backward: the per-row inputs (backward_rows.cuh) into the workspace, then the key-major
// kernel (dK, dV) and the query-major kernel (dQ). Included only by the generated instantiation files (sm_90a).
#pragma once

#include <cstdint>
#include <climits>

#include <cuda_runtime.h>

#include "../../attention_params.h"
#include "backward_kernel.cuh"
#include "backward_rows.cuh"
#include "hopper.h"
#include "query_gradient_sum.cuh"

namespace jax_flash::cuda_kernels::hopper {

template <BackwardRole kRole, class Config>
cudaError_t launch_backward_role(const AttentionBackwardParams& params, const float* lse_log2, const float* delta,
                                 float* query_gradient_sum, cudaStream_t stream) {
  using Element = typename Config::Element;
  constexpr bool kKeyMajor = kKeyMajorRole<kRole>;
  const AttentionShape& s = params.shape;
  const GlobalShape shape_q(int32_t(s.seqlen_q), int32_t(s.head_dim), int32_t(s.heads_q), int32_t(s.batch));
  const GlobalShape shape_kv(int32_t(s.seqlen_k), int32_t(s.head_dim), int32_t(s.heads_kv), int32_t(s.batch));
  BackwardKernelParams<Config> p{};
  p.shape_resident = kKeyMajor ? shape_kv : shape_q;
  p.shape_streamed = kKeyMajor ? shape_q : shape_kv;
  const void* resident_a = kKeyMajor ? params.k : params.q;
  const void* resident_b = kKeyMajor ? params.v : params.dout;
  const void* streamed_a = kKeyMajor ? params.q : params.k;
  const void* streamed_b = kKeyMajor ? params.dout : params.v;
  const auto resident_tile = take<0, 2>(typename Config::ResidentLayout{});
  const auto streamed_tile = take<0, 2>(typename Config::StreamedLayout{});
  p.tma_resident_a =
      make_tma_copy(SM90_TMA_LOAD{}, global_tensor<Element>(resident_a, p.shape_resident), resident_tile);
  p.tma_resident_b =
      make_tma_copy(SM90_TMA_LOAD{}, global_tensor<Element>(resident_b, p.shape_resident), resident_tile);
  p.tma_streamed_a =
      make_tma_copy(SM90_TMA_LOAD{}, global_tensor<Element>(streamed_a, p.shape_streamed), streamed_tile);
  p.tma_streamed_b =
      make_tma_copy(SM90_TMA_LOAD{}, global_tensor<Element>(streamed_b, p.shape_streamed), streamed_tile);
  const int64_t padded = padded_rows(s.seqlen_q);
  p.shape_stats = RowStatsShape(int32_t(padded), int32_t(s.heads_q), int32_t(s.batch));
  auto stats = [&](const float* data) {
    return make_tensor(make_gmem_ptr(data), p.shape_stats, RowStatsStride(_1{}, padded, padded * s.heads_q));
  };
  p.tma_lse = make_tma_copy(SM90_TMA_LOAD{}, stats(lse_log2), typename Config::StatsLayout{});
  p.tma_delta = make_tma_copy(SM90_TMA_LOAD{}, stats(delta), typename Config::StatsLayout{});
  p.lse_log2 = lse_log2;
  p.delta = delta;
  p.grad_a = kKeyMajor ? params.dk : params.dq;
  p.grad_b = kKeyMajor ? params.dv : nullptr;
  p.query_gradient_sum = query_gradient_sum;
  p.seqlen_q = int(s.seqlen_q);
  p.seqlen_k = int(s.seqlen_k);
  p.heads_q = int(s.heads_q);
  p.group = int(s.group());
  p.head_dim = int(s.head_dim);
  p.padded_seqlen_q = int(padded);
  p.mask = params.mask;
  p.tokens = params.tokens;
  p.has_tokens = params.tokens.any();
  p.scale = params.scale;
  p.scale_log2 = float(M_LOG2E) * (params.mask.softcap > 0.f ? 1.f : params.scale);

  const int64_t rows = kKeyMajor ? s.seqlen_k : s.seqlen_q;
  const dim3 grid(unsigned((rows + Config::kResident - 1) / Config::kResident),
                  unsigned(kKeyMajor ? s.heads_kv : s.heads_q), unsigned(s.batch));
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return cudaSuccess;
  auto* kernel =
      params.mask.softcap > 0.f ? &backward_kernel<kRole, true, Config> : &backward_kernel<kRole, false, Config>;
  cudaError_t status =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Config::kSmemBytes);
  if (status != cudaSuccess) return status;
  kernel<<<grid, Config::kThreads, Config::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

// kKeyPasses: 1 runs the key-major kernel once for dK and dV together, 2 runs it once per gradient (for head dims
// whose two accumulators exceed the consumers' registers).
template <class KeyConfig, class QueryConfig, int kKeyPasses>
cudaError_t launch_backward_configs(const AttentionBackwardParams& params, void* workspace, cudaStream_t stream) {
  const AttentionShape& s = params.shape;
  if (s.batch == 0 || s.heads_q == 0) return cudaSuccess;
  // A TMA descriptor cannot describe an empty tensor; the sm80 kernels handle (and zero-fill) those calls.
  if (s.seqlen_q == 0 || s.seqlen_k == 0) return cudaErrorNotSupported;
  if (s.heads_q > 65535 || s.batch > 65535 || s.seqlen_q > INT32_MAX - kRowPadding) return cudaErrorNotSupported;
  auto* lse_log2 = static_cast<float*>(workspace);
  float* delta = lse_log2 + s.batch * s.heads_q * padded_rows(s.seqlen_q);
  cudaError_t status = launch_backward_rows<typename KeyConfig::Element>(params, lse_log2, delta, stream);
  static_assert(kKeyPasses == 1 || kKeyPasses == 2);
  if constexpr (kKeyPasses == 1 && KeyConfig::kStreamed == 64 && KeyConfig::kHeadDim == kFusedHeadDim) {
    if (fuses_query_gradient(s, params.deterministic)) {
      // The workspace was sized for sum rows of sum_row_stride(head_dim) floats; this instantiation writes its own.
      if (sum_row_stride(s.head_dim) != KeyConfig::kHeadDim + kSumRowPad) return cudaErrorInvalidValue;
      const size_t rows_bytes = backward_rows_bytes(s);
      float* sum = reinterpret_cast<float*>(static_cast<char*>(workspace) + query_gradient_sum_offset(rows_bytes));
      if (status == cudaSuccess) status = cudaMemsetAsync(sum, 0, query_gradient_sum_bytes(s), stream);
      if (status == cudaSuccess)
        status = launch_backward_role<BackwardRole::kFused, FusedBackwardConfig<KeyConfig>>(params, lse_log2, delta,
                                                                                            sum, stream);
      if (status == cudaSuccess)
        status = launch_round_query_gradient<typename KeyConfig::Element>(sum, params.dq, s, params.scale, stream);
      return status;
    }
  }
  if constexpr (kKeyPasses == 1) {
    if (status == cudaSuccess)
      status = launch_backward_role<BackwardRole::kKeysAndValues, KeyConfig>(params, lse_log2, delta, nullptr, stream);
  } else {
    if (status == cudaSuccess)
      status = launch_backward_role<BackwardRole::kValues, KeyConfig>(params, lse_log2, delta, nullptr, stream);
    if (status == cudaSuccess)
      status = launch_backward_role<BackwardRole::kKeys, KeyConfig>(params, lse_log2, delta, nullptr, stream);
  }
  if (status == cudaSuccess)
    status = launch_backward_role<BackwardRole::kQueries, QueryConfig>(params, lse_log2, delta, nullptr, stream);
  return status;
}

}  // namespace jax_flash::cuda_kernels::hopper
