// In-place KV cache update on the CPU: a plain copy of each new row to its page slot (the FFI outputs alias the
// caches, so only the new rows are written).
#include <cstring>

#include "decode_cpu.h"

namespace jax_flash {

void kv_cache_update_cpu(const KvCacheUpdateParams& p, const ParallelFor& parallel_for) {
  const int64_t heads = p.cache.heads_kv, row_bytes = p.cache.head_dim * dtype_bytes(p.dtype);
  parallel_for(p.batch, [&](int64_t b) {
    for (int64_t t = 0; t < p.new_len; ++t) {
      const int64_t position = int64_t{p.positions[b]} + t;
      if (!p.cache.holds(b, position)) continue;
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t src = ((b * p.new_len + t) * heads + h) * row_bytes;
        const int64_t dst = p.cache.offset(b, position, h) / p.cache.head_dim * row_bytes;
        std::memcpy(static_cast<char*>(p.k) + dst, static_cast<const char*>(p.new_k) + src, row_bytes);
        std::memcpy(static_cast<char*>(p.v) + dst, static_cast<const char*>(p.new_v) + src, row_bytes);
      }
    }
  });
}

}  // namespace jax_flash
