// In-place KV cache update: each thread copies one 16-byte chunk of a new K row and of the matching V row to the
// row's page slot. The FFI outputs alias the caches, so nothing but the new rows is written.
#include <algorithm>
#include <cstdint>

#include "decode_cuda.h"

namespace jax_flash {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65536;  // grid-stride beyond this: each thread then copies several chunks

__global__ void __launch_bounds__(kThreads) kv_cache_update_kernel(KvCacheUpdateParams p, int64_t chunks_per_row) {
  const int64_t heads = p.cache.heads_kv, total = p.batch * p.new_len * heads * chunks_per_row;
  for (int64_t index = blockIdx.x * int64_t{kThreads} + threadIdx.x; index < total;
       index += int64_t{gridDim.x} * kThreads) {
    const int64_t chunk = index % chunks_per_row, row = index / chunks_per_row;  // row over [b, t, h]
    const int64_t h = row % heads, t = (row / heads) % p.new_len, b = row / (heads * p.new_len);
    const int64_t position = int64_t{p.positions[b]} + t;
    if (!p.cache.holds(b, position)) continue;
    // Offsets in 16-byte units: head_dim rows are whole chunks (checked by the launcher).
    const int64_t dst = p.cache.offset(b, position, h) / p.cache.head_dim * chunks_per_row + chunk;
    static_cast<uint4*>(p.k)[dst] = static_cast<const uint4*>(p.new_k)[index];
    static_cast<uint4*>(p.v)[dst] = static_cast<const uint4*>(p.new_v)[index];
  }
}

bool aligned_16(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer) % 16 == 0; }

}  // namespace

cudaError_t launch_kv_cache_update(const KvCacheUpdateParams& p, cudaStream_t stream) {
  const int64_t row_bytes = p.cache.head_dim * dtype_bytes(p.dtype);
  const bool aligned = aligned_16(p.k) && aligned_16(p.v) && aligned_16(p.new_k) && aligned_16(p.new_v);
  if (row_bytes % 16 != 0 || !aligned) return cudaErrorInvalidValue;
  const int64_t chunks_per_row = row_bytes / 16, total = p.batch * p.new_len * p.cache.heads_kv * chunks_per_row;
  if (total == 0) return cudaSuccess;
  const int64_t blocks = std::min<int64_t>((total + kThreads - 1) / kThreads, kMaxBlocks);
  kv_cache_update_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p, chunks_per_row);
  return cudaGetLastError();
}

}  // namespace jax_flash
