#include "decode_operands.h"

#include <string>

namespace jax_flash {
namespace {

// k and v pools [num_pages, page_size, heads_kv, head_dim] of one dtype, and the page table [batch, pages_per_seq].
ffi::Error decode_cache(const PlatformLimits& limits, const ffi::AnyBuffer& k, const ffi::AnyBuffer& v,
                        const ffi::Buffer<ffi::S32>& page_table, int64_t batch, PagedCache* cache, DType* dtype) {
  const auto kd = k.dimensions(), td = page_table.dimensions();
  if (kd.size() != 4) return invalid("the key cache must have rank 4, got " + dims_string(kd));
  if (auto error = check_dims("the value cache", v.dimensions(), {kd[0], kd[1], kd[2], kd[3]}); error.failure())
    return error;
  if (k.element_type() != v.element_type()) return invalid("the key and value caches have different dtypes");
  if (auto error = element_dtype(k.element_type(), dtype); error.failure()) return error;
  if (td.size() != 2 || td[0] != batch)
    return invalid("page_table has shape " + dims_string(td) + ", expected [batch=" + std::to_string(batch) +
                   ", pages_per_seq]");
  *cache = PagedCache{kd[0], kd[1], td[1], kd[2], kd[3], page_table.typed_data()};
  for (int64_t extent : {cache->num_pages, cache->page_size, cache->pages_per_seq, cache->heads_kv, cache->head_dim})
    if (extent <= 0) return invalid("cache and page_table dimensions must be positive");
  return check_head_dim(limits, cache->head_dim);
}

}  // namespace

ffi::Error decode_decode(const PlatformLimits& limits, const ffi::AnyBuffer& q, const ffi::AnyBuffer& k,
                         const ffi::AnyBuffer& v, const ffi::Buffer<ffi::S32>& lengths,
                         const ffi::Buffer<ffi::S32>& page_table, ffi::AnyBuffer& out, ffi::Buffer<ffi::F32>& lse,
                         const AttentionAttrs& attrs, DecodeParams* params) {
  const auto qd = q.dimensions();
  if (qd.size() != 4) return invalid("query must have rank 4 [batch, q_len, heads, head_dim], got " + dims_string(qd));
  if (auto error = decode_cache(limits, k, v, page_table, qd[0], &params->cache, &params->dtype); error.failure())
    return error;
  if (q.element_type() != k.element_type()) return invalid("query and the caches have different dtypes");
  params->batch = qd[0];
  params->q_len = qd[1];
  params->heads_q = qd[2];
  if (params->batch <= 0 || params->q_len <= 0 || params->heads_q <= 0)
    return invalid("query dimensions must be positive, got " + dims_string(qd));
  if (qd[3] != params->cache.head_dim) return invalid("query and cache head_dim differ");
  if (params->heads_q % params->cache.heads_kv != 0) return invalid("query heads must be a multiple of kv heads");
  if (auto error = check_dims("cache_lengths", lengths.dimensions(), {qd[0]}); error.failure()) return error;
  if (auto error = check_dims("out", out.dimensions(), {qd[0], qd[1], qd[2], qd[3]}); error.failure()) return error;
  if (out.element_type() != q.element_type()) return invalid("out has a different dtype than query");
  if (auto error = check_dims("lse", lse.dimensions(), {qd[0], qd[2], qd[1]}); error.failure()) return error;
  if (attrs.window_right != 0) return invalid("decode is causal: window_right must be 0");
  params->mask = to_mask(attrs);
  params->scale = attrs.scale;
  params->q = q.untyped_data();
  params->k = k.untyped_data();
  params->v = v.untyped_data();
  params->lengths = lengths.typed_data();
  params->out = out.untyped_data();
  params->lse = lse.typed_data();
  return ffi::Error::Success();
}

ffi::Error decode_kv_cache_update(const PlatformLimits& limits, const ffi::AnyBuffer& k, const ffi::AnyBuffer& v,
                                  const ffi::AnyBuffer& new_k, const ffi::AnyBuffer& new_v,
                                  const ffi::Buffer<ffi::S32>& positions, const ffi::Buffer<ffi::S32>& page_table,
                                  ffi::AnyBuffer& k_out, ffi::AnyBuffer& v_out, KvCacheUpdateParams* params) {
  const auto nd = new_k.dimensions();
  if (nd.size() != 4) return invalid("new_k must have rank 4 [batch, new_len, kv_heads, head_dim], got " +
                                     dims_string(nd));
  if (auto error = decode_cache(limits, k, v, page_table, nd[0], &params->cache, &params->dtype); error.failure())
    return error;
  if (auto error = check_dims("new_k", nd, {nd[0], nd[1], params->cache.heads_kv, params->cache.head_dim});
      error.failure())
    return error;
  if (auto error = check_dims("new_v", new_v.dimensions(), {nd[0], nd[1], nd[2], nd[3]}); error.failure())
    return error;
  if (new_k.element_type() != k.element_type() || new_v.element_type() != k.element_type())
    return invalid("new_k and new_v must have the dtype of the caches");
  if (auto error = check_dims("positions", positions.dimensions(), {nd[0]}); error.failure()) return error;
  // The results alias the caches (input_output_aliases), so they are the same buffers.
  if (k_out.untyped_data() != k.untyped_data() || v_out.untyped_data() != v.untyped_data())
    return invalid("the updated caches must alias the input caches");
  params->batch = nd[0];
  params->new_len = nd[1];
  params->new_k = new_k.untyped_data();
  params->new_v = new_v.untyped_data();
  params->positions = positions.typed_data();
  params->k = k_out.untyped_data();
  params->v = v_out.untyped_data();
  return ffi::Error::Success();
}

}  // namespace jax_flash
