// Tiled flash attention on the CPU: online softmax, float32 accumulation, never an S x S matrix.
#pragma once

#include <cstdint>
#include <functional>

#include "../attention_params.h"

namespace jax_flash {

// Runs body(i) for every i in [0, n), possibly concurrently, and returns when all have finished.
using ParallelFor = std::function<void(int64_t n, const std::function<void(int64_t)>& body)>;

void attention_forward_cpu(const AttentionForwardParams& params, int64_t num_threads, const ParallelFor& parallel_for);
void attention_backward_cpu(const AttentionBackwardParams& params, int64_t num_threads,
                            const ParallelFor& parallel_for);

}  // namespace jax_flash
