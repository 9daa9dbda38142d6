// The plain description of one attention call that every kernel (CPU or CUDA) receives.
// Nothing here depends on XLA or nanobind: FFI handlers fill these structs, kernels read them.
#pragma once

#include <cstdint>

namespace jax_flash {

enum class DType : int { kFloat32, kFloat16, kBFloat16 };

// Tensors are contiguous, layout [batch, seq, heads, head_dim]; lse is [batch, heads_q, seqlen_q] float32.
struct AttentionShape {
  int64_t batch;
  int64_t seqlen_q;
  int64_t seqlen_k;
  int64_t heads_q;
  int64_t heads_kv;  // heads_q is a multiple of heads_kv (GQA/MQA); query head h reads kv head h / group.
  int64_t head_dim;

  int64_t group() const { return heads_q / heads_kv; }
};

// Which keys a query may see. Query i sees key j when i - window_left <= j <= i + window_right, where a negative
// window bound means "unbounded" on that side. Causal (as in jax.nn: top-left aligned) is window_right = 0.
struct AttentionMask {
  int64_t window_left;
  int64_t window_right;
  float softcap;  // logits s become softcap * tanh(s / softcap) when softcap > 0.
};

// What a run of kTokenChunk consecutive tokens of one batch row holds, over its live tokens (those below the
// sequence length and the row's length): the range of their segment ids (0 when absent) and of their positions (the
// token indices when absent); min > max when none is live. The CUDA launch summarizes every chunk once per call
// (csrc/cuda/token_chunks.cu), and kernels classify a tile of tokens from its chunks instead of its ids.
constexpr int64_t kTokenChunk = 32;

struct alignas(16) TokenChunk {  // one 16-byte load
  int32_t segment_min, segment_max;
  int32_t position_min, position_max;
};

// Per-token visibility on top of the window, all int32. A null pointer means the input is absent, and the default
// (all null) means dense attention. Query i of batch row b sees key j only when
//   i < q_lengths[b], j < kv_lengths[b], q_segment_ids[b, i] == kv_segment_ids[b, j],
// and the window test of AttentionMask holds for q_positions[b, i] and kv_positions[b, j] in place of i and j.
struct TokenMask {
  const int32_t* q_lengths = nullptr;       // [batch]
  const int32_t* kv_lengths = nullptr;      // [batch]
  const int32_t* q_segment_ids = nullptr;   // [batch, seqlen_q]
  const int32_t* kv_segment_ids = nullptr;  // [batch, seqlen_k]
  const int32_t* q_positions = nullptr;     // [batch, seqlen_q]
  const int32_t* kv_positions = nullptr;    // [batch, seqlen_k]
  // Set by the CUDA launch, not by the handlers: [batch, ceil(seqlen / kTokenChunk)] summaries of each side.
  const TokenChunk* q_chunks = nullptr;
  const TokenChunk* kv_chunks = nullptr;

  bool any() const {
    return q_lengths || kv_lengths || q_segment_ids || kv_segment_ids || q_positions || kv_positions;
  }
};

struct AttentionForwardParams {
  DType dtype;
  AttentionShape shape;
  AttentionMask mask;
  float scale;  // multiplies q.k before the softcap and the softmax.
  const void* q;
  const void* k;
  const void* v;
  void* out;
  float* lse;  // natural-log sum of exp over visible keys; -inf for a row that sees no key (its output is 0).
  TokenMask tokens;  // last, and defaulted, so positional initializers written before it still compile
  const float* descale = nullptr;  // FP8 calls: {query_scale * key_scale, value_scale} on the device
};

struct AttentionBackwardParams {
  DType dtype;
  AttentionShape shape;
  AttentionMask mask;
  float scale;
  const void* dout;
  const void* q;
  const void* k;
  const void* v;
  const void* out;
  const float* lse;
  void* dq;
  void* dk;
  void* dv;
  TokenMask tokens;
  // Bitwise-identical gradients run to run. When false, the Hopper kernels may sum dQ with reduce-adds in a varying
  // order (one pass over the keys instead of two); every other kernel is deterministic either way.
  bool deterministic;
};

}  // namespace jax_flash
