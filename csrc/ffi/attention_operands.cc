#include "attention_operands.h"

#include <tuple>
#include <vector>

namespace jax_flash {
namespace {

// `buffer` must have the dtype and shape of `like`.
ffi::Error check_like(const char* name, const ffi::AnyBuffer& buffer, const ffi::AnyBuffer& like) {
  const ffi::DataType dtype = buffer.element_type(), expected_dtype = like.element_type();
  const auto dims = buffer.dimensions(), expected_dims = like.dimensions();
  if (dtype != expected_dtype) return invalid(std::string(name) + " has a different dtype than expected");
  return check_dims(name, dims, expected_dims);
}

// Validates the shapes of q [B, Sq, Hq, D], k and v [B, Sk, Hkv, D] (v like k, k of q's dtype) and fills shape.
ffi::Error decode_qkv_shape(const ffi::AnyBuffer& q, const ffi::AnyBuffer& k, const ffi::AnyBuffer& v,
                            const PlatformLimits& limits, AttentionShape* shape) {
  auto qd = q.dimensions(), kd = k.dimensions();
  if (qd.size() != 4 || kd.size() != 4)
    return invalid("query and key must be rank 4 [batch, seq, heads, head_dim], got " + dims_string(qd) + " and " +
                   dims_string(kd));
  if (auto error = check_like("value", v, k); error.failure()) return error;
  if (k.element_type() != q.element_type()) return invalid("query and key must have the same dtype");
  *shape = AttentionShape{qd[0], qd[1], kd[1], qd[2], kd[2], qd[3]};
  if (kd[0] != qd[0]) return invalid("query and key batch sizes differ: " + dims_string(qd) + " vs " + dims_string(kd));
  if (kd[3] != qd[3]) return invalid("query and key head_dim differ: " + dims_string(qd) + " vs " + dims_string(kd));
  for (int64_t extent : {shape->batch, shape->seqlen_q, shape->seqlen_k, shape->heads_q, shape->heads_kv,
                         shape->head_dim})
    if (extent <= 0) return invalid("every dimension must be positive, got " + dims_string(qd) + " and " + dims_string(kd));
  if (shape->heads_q % shape->heads_kv != 0) return invalid("query heads must be a multiple of key/value heads");
  return check_head_dim(limits, shape->head_dim);
}

// decode_qkv_shape, and the dtype of the 16- and 32-bit calls.
ffi::Error decode_qkv(const ffi::AnyBuffer& q, const ffi::AnyBuffer& k, const ffi::AnyBuffer& v,
                      const PlatformLimits& limits, AttentionShape* shape, DType* dtype) {
  if (auto error = element_dtype(q.element_type(), dtype); error.failure()) return error;
  return decode_qkv_shape(q, k, v, limits, shape);
}

// lse is [B, Hq, Sq].
ffi::Error check_lse(ffi::Span<const int64_t> dims, const AttentionShape& shape) {
  return check_dims("lse [batch, heads, seq_q]", dims, {shape.batch, shape.heads_q, shape.seqlen_q});
}

// Fills `mask` from the token-mask operands, checking each present one's dtype and shape, that the absent ones are
// zero-size placeholders, and that segment ids and positions come as (query, key/value) pairs.
ffi::Error decode_tokens(const ffi::RemainingArgs& args, int64_t present, const AttentionShape& shape,
                         TokenMask* mask) {
  struct Input {
    const char* name;
    int64_t bit;
    std::vector<int64_t> dims;
    const int32_t** data;
  };
  const Input inputs[kTokenInputCount] = {
      {"query_seq_lengths", kQueryLengths, {shape.batch}, &mask->q_lengths},
      {"key_value_seq_lengths", kKeyValueLengths, {shape.batch}, &mask->kv_lengths},
      {"query segment ids", kQuerySegmentIds, {shape.batch, shape.seqlen_q}, &mask->q_segment_ids},
      {"key/value segment ids", kKeyValueSegmentIds, {shape.batch, shape.seqlen_k}, &mask->kv_segment_ids},
      {"query segment positions", kQueryPositions, {shape.batch, shape.seqlen_q}, &mask->q_positions},
      {"key/value segment positions", kKeyValuePositions, {shape.batch, shape.seqlen_k}, &mask->kv_positions},
  };
  if (args.size() != kTokenInputCount)
    return invalid("expected " + std::to_string(kTokenInputCount) + " token-mask operands after the attention "
                   "operands, got " + std::to_string(args.size()));
  if (present & ~int64_t{(1 << kTokenInputCount) - 1}) return invalid("unknown bits in mask_inputs");
  for (int64_t pair : {kQuerySegmentIds | kKeyValueSegmentIds, kQueryPositions | kKeyValuePositions})
    if ((present & pair) != 0 && (present & pair) != pair)
      return invalid("segment ids and segment positions must be given for both queries and keys/values");
  for (int i = 0; i < kTokenInputCount; ++i) {
    const Input& input = inputs[i];
    auto buffer = args.get<ffi::AnyBuffer>(i);
    if (buffer.has_error()) return buffer.error();
    if (buffer->element_type() != ffi::DataType::S32) return invalid(std::string(input.name) + " must be int32");
    const auto dims = buffer->dimensions();
    if (!(present & input.bit)) {
      if (buffer->element_count() != 0)
        return invalid(std::string(input.name) + " is marked absent but its placeholder is not empty");
      continue;
    }
    if (auto error = check_dims(input.name, dims, input.dims); error.failure()) return error;
    *input.data = buffer->typed_data<int32_t>();
  }
  return ffi::Error::Success();
}

// The forward calls' token operands, lse, attributes and pointers, once shapes and dtypes are settled.
ffi::Error decode_forward_rest(const ffi::AnyBuffer& q, const ffi::AnyBuffer& k, const ffi::AnyBuffer& v,
                               const ffi::RemainingArgs& tokens, ffi::AnyBuffer& out, ffi::Buffer<ffi::F32>& lse,
                               const AttentionAttrs& attrs, AttentionForwardParams* params) {
  if (auto error = decode_tokens(tokens, attrs.mask_inputs, params->shape, &params->tokens); error.failure())
    return error;
  if (auto error = check_lse(lse.dimensions(), params->shape); error.failure()) return error;
  params->mask = to_mask(attrs);
  params->scale = attrs.scale;
  params->q = q.untyped_data();
  params->k = k.untyped_data();
  params->v = v.untyped_data();
  params->out = out.untyped_data();
  params->lse = lse.typed_data();
  return ffi::Error::Success();
}

}  // namespace

ffi::Error decode_forward(const PlatformLimits& limits, const ffi::AnyBuffer& q, const ffi::AnyBuffer& k,
                          const ffi::AnyBuffer& v, const ffi::RemainingArgs& tokens, ffi::AnyBuffer& out,
                          ffi::Buffer<ffi::F32>& lse, const AttentionAttrs& attrs, AttentionForwardParams* params) {
  if (auto error = decode_qkv(q, k, v, limits, &params->shape, &params->dtype); error.failure()) return error;
  if (auto error = check_like("out", out, q); error.failure()) return error;
  return decode_forward_rest(q, k, v, tokens, out, lse, attrs, params);
}

ffi::Error decode_fp8_forward(const PlatformLimits& limits, const ffi::AnyBuffer& q, const ffi::AnyBuffer& k,
                              const ffi::AnyBuffer& v, const ffi::Buffer<ffi::F32>& descale,
                              const ffi::RemainingArgs& tokens, ffi::AnyBuffer& out, ffi::Buffer<ffi::F32>& lse,
                              const AttentionAttrs& attrs, AttentionForwardParams* params) {
  if (q.element_type() != ffi::DataType::F8E4M3FN) return invalid("FP8 attention takes float8_e4m3fn inputs");
  if (auto error = decode_qkv_shape(q, k, v, limits, &params->shape); error.failure()) return error;
  if (out.element_type() != ffi::DataType::BF16 || !(out.dimensions() == q.dimensions()))
    return invalid("FP8 attention's out must be bfloat16 shaped like the query, got " + dims_string(out.dimensions()));
  if (descale.element_count() != 2)
    return invalid("FP8 attention's descale operand must hold {query_scale * key_scale, value_scale}");
  params->dtype = DType::kBFloat16;  // of the output; the inputs are e4m3
  params->descale = descale.typed_data();
  return decode_forward_rest(q, k, v, tokens, out, lse, attrs, params);
}

ffi::Error decode_backward(const PlatformLimits& limits, const ffi::AnyBuffer& dout, const ffi::AnyBuffer& q,
                           const ffi::AnyBuffer& k, const ffi::AnyBuffer& v, const ffi::AnyBuffer& out,
                           const ffi::Buffer<ffi::F32>& lse, const ffi::RemainingArgs& tokens, ffi::AnyBuffer& dq,
                           ffi::AnyBuffer& dk, ffi::AnyBuffer& dv, const AttentionAttrs& attrs,
                           AttentionBackwardParams* params) {
  if (auto error = decode_qkv(q, k, v, limits, &params->shape, &params->dtype); error.failure()) return error;
  if (auto error = decode_tokens(tokens, attrs.mask_inputs, params->shape, &params->tokens); error.failure())
    return error;
  if (auto error = check_lse(lse.dimensions(), params->shape); error.failure()) return error;
  using Pair = std::tuple<const char*, const ffi::AnyBuffer*, const ffi::AnyBuffer*>;
  for (auto [name, buffer, like] : {Pair{"dout", &dout, &q}, Pair{"out", &out, &q}, Pair{"dq", &dq, &q},
                                    Pair{"dk", &dk, &k}, Pair{"dv", &dv, &v}})
    if (auto error = check_like(name, *buffer, *like); error.failure()) return error;
  params->mask = to_mask(attrs);
  params->scale = attrs.scale;
  params->deterministic = attrs.deterministic != 0;
  params->dout = dout.untyped_data();
  params->q = q.untyped_data();
  params->k = k.untyped_data();
  params->v = v.untyped_data();
  params->out = out.untyped_data();
  params->lse = lse.typed_data();
  params->dq = dq.untyped_data();
  params->dk = dk.untyped_data();
  params->dv = dv.untyped_data();
  return ffi::Error::Success();
}

}  // namespace jax_flash
