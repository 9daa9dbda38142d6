// Launch interface of the CUDA decode kernels (split-KV flash-decoding) and of the in-place KV cache update. The
// FFI handlers call only these functions.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "../decode_params.h"
#include "decode_tuning.h"

namespace jax_flash {

// How a decode call is spread over the GPU: the key range of every (sequence, kv head) is split `splits` ways, and
// with more than one split the partial results go through `workspace_bytes` of device scratch.
struct DecodePlan {
  int64_t splits;
  size_t workspace_bytes;
  DecodeTuning tuning;  // kernel shape and grid order: kDefaultDecodeTuning outside the harness's sweep
};

// Chooses the plan from the shape and the SM count of the current device (read once per device, then cached), with
// at most `workspace_limit` bytes of workspace: the split count is capped to fit (one split needs none).
cudaError_t plan_decode(const DecodeParams& params, size_t workspace_limit, DecodePlan* plan);

// The same with the given knobs instead of kDefaultDecodeTuning (the harness's sweep).
cudaError_t plan_decode_tuned(const DecodeParams& params, const DecodeTuning& tuning, size_t workspace_limit,
                              DecodePlan* plan);

// Returns the launch error (never synchronizes the stream). `workspace` holds plan.workspace_bytes, allocated by
// the caller through XLA. On a stream that is being captured into a CUDA graph (XLA's command buffers) the combine
// is launched plainly, not as a programmatic dependent.
cudaError_t launch_decode(const DecodeParams& params, const DecodePlan& plan, void* workspace, cudaStream_t stream);

cudaError_t launch_kv_cache_update(const KvCacheUpdateParams& params, cudaStream_t stream);

}  // namespace jax_flash
