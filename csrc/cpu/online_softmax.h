// The online-softmax step every CPU forward takes per row and key tile, so the attention and decode kernels share it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "tile_math.h"

namespace jax_flash::cpu {

// Folds one tile of a row's logits s[0, cols) (masked ones -inf, tile_max their maximum) into the running max, sum
// and output o[0, d): s becomes the tile's probabilities relative to the new max, ready for o += s v. While the row
// has seen no visible key, s becomes 0 so it contributes nothing (and no -inf - -inf makes a NaN).
inline void online_softmax_step(float* s, int64_t cols, float tile_max, float& row_max, float& row_sum, float* o,
                                int64_t d) {
  const float new_max = std::max(row_max, tile_max);
  if (new_max == -INFINITY) {
    std::fill(s, s + cols, 0.f);
    return;
  }
  const float correction = std::exp(row_max - new_max);
  row_sum = row_sum * correction + exp_shifted_sum(s, cols, new_max);
  row_max = new_max;
  if (correction != 1.f)
    for (int64_t x = 0; x < d; ++x) o[x] *= correction;
}

}  // namespace jax_flash::cpu
