// Visibility and logit rules shared by every kernel, host and device, so all paths mask identically.
#pragma once

#include <cmath>
#include <cstdint>

#include "attention_params.h"

#if defined(__CUDACC__)
#define JAX_FLASH_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define JAX_FLASH_HOST_DEVICE inline
#endif

namespace jax_flash {

JAX_FLASH_HOST_DEVICE bool key_visible(const AttentionMask& m, int64_t i, int64_t j) {
  return (m.window_left < 0 || j >= i - m.window_left) && (m.window_right < 0 || j <= i + m.window_right);
}

// First key index (inclusive) and last key index (exclusive) any query row in [row_begin, row_end) may see.
JAX_FLASH_HOST_DEVICE int64_t first_visible_key(const AttentionMask& m, int64_t row_begin) {
  if (m.window_left < 0) return 0;
  int64_t j = row_begin - m.window_left;
  return j < 0 ? 0 : j;
}

JAX_FLASH_HOST_DEVICE int64_t end_visible_key(const AttentionMask& m, int64_t row_end, int64_t seqlen_k) {
  if (m.window_right < 0) return seqlen_k;
  int64_t j = row_end - 1 + m.window_right + 1;
  return j < seqlen_k ? j : seqlen_k;
}

// The same bounds seen from a key block: the query rows that may see any key in [key_begin, key_end).
JAX_FLASH_HOST_DEVICE int64_t first_row_seeing(const AttentionMask& m, int64_t key_begin) {
  if (m.window_right < 0) return 0;
  int64_t i = key_begin - m.window_right;
  return i < 0 ? 0 : i;
}

JAX_FLASH_HOST_DEVICE int64_t end_row_seeing(const AttentionMask& m, int64_t key_end, int64_t seqlen_q) {
  if (m.window_left < 0) return seqlen_q;
  int64_t i = key_end - 1 + m.window_left + 1;
  return i < seqlen_q ? i : seqlen_q;
}

// Whether every query row in [row_begin, row_end) sees every key in [key_begin, key_end) under the window, so a
// tile of them needs no per-element mask. Keys past seqlen_k are the caller's concern.
JAX_FLASH_HOST_DEVICE bool tile_inside_window(const AttentionMask& m, int64_t row_begin, int64_t row_end,
                                              int64_t key_begin, int64_t key_end) {
  return (m.window_left < 0 || key_begin >= row_end - 1 - m.window_left) &&
         (m.window_right < 0 || key_end - 1 <= row_begin + m.window_right);
}

// Whether query i sees key j of batch row b under the window and the per-token inputs of TokenMask. Segment ids
// and positions come in pairs (query and key/value), which the FFI handlers check.
JAX_FLASH_HOST_DEVICE bool token_visible(const AttentionMask& m, const TokenMask& t, const AttentionShape& sh,
                                         int64_t b, int64_t i, int64_t j) {
  if (t.q_lengths && i >= t.q_lengths[b]) return false;
  if (t.kv_lengths && j >= t.kv_lengths[b]) return false;
  if (t.q_segment_ids && t.q_segment_ids[b * sh.seqlen_q + i] != t.kv_segment_ids[b * sh.seqlen_k + j]) return false;
  const int64_t query_position = t.q_positions ? t.q_positions[b * sh.seqlen_q + i] : i;
  const int64_t key_position = t.kv_positions ? t.kv_positions[b * sh.seqlen_k + j] : j;
  return key_visible(m, query_position, key_position);
}

// Logit after the optional soft-cap; `raw` is already multiplied by the softmax scale.
JAX_FLASH_HOST_DEVICE float capped_logit(float raw, float softcap) {
  return softcap > 0.f ? softcap * tanhf(raw / softcap) : raw;
}

// d(capped)/d(raw), written in terms of the capped value to avoid a second tanh.
JAX_FLASH_HOST_DEVICE float capped_logit_slope(float capped, float softcap) {
  if (softcap <= 0.f) return 1.f;
  float t = capped / softcap;
  return 1.f - t * t;
}

}  // namespace jax_flash
