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
};

}  // namespace jax_flash
