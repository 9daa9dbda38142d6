// Decode (new queries against a KV cache) and the in-place cache update on the CPU.
#pragma once

#include <cstdint>

#include "../decode_params.h"
#include "attention_cpu.h"

namespace jax_flash {

void decode_cpu(const DecodeParams& params, int64_t num_threads, const ParallelFor& parallel_for);
void kv_cache_update_cpu(const KvCacheUpdateParams& params, const ParallelFor& parallel_for);

}  // namespace jax_flash
