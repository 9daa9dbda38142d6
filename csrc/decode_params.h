// The plain description of one decode call (new queries against a KV cache) and of one cache update, shared by the
// CPU and CUDA kernels. Nothing here depends on XLA or nanobind.
//
// Both cache layouts are one: the cache is a pool of pages [num_pages, page_size, heads_kv, head_dim] and sequence b
// reads its key j from page page_table[b][j / page_size], row j % page_size. A contiguous cache
// [batch, max_len, heads_kv, head_dim] is the pool with page_size = max_len and page_table[b] = {b}.
#pragma once

#include <cstdint>

#include "attention_mask.h"
#include "attention_params.h"

namespace jax_flash {

struct PagedCache {
  int64_t num_pages;
  int64_t page_size;
  int64_t pages_per_seq;
  int64_t heads_kv;
  int64_t head_dim;
  const int32_t* page_table;  // [batch, pages_per_seq]

  JAX_FLASH_HOST_DEVICE int64_t capacity() const { return pages_per_seq * page_size; }

  JAX_FLASH_HOST_DEVICE int64_t page(int64_t b, int64_t j) const { return page_table[b * pages_per_seq + j / page_size]; }

  // Whether position j of sequence b has a slot: inside the capacity and on a page id of the pool.
  JAX_FLASH_HOST_DEVICE bool holds(int64_t b, int64_t j) const {
    if (j < 0 || j >= capacity()) return false;
    const int64_t id = page(b, j);
    return id >= 0 && id < num_pages;
  }

  // Element offset of (sequence b, position j < capacity, kv head h) in the pool. Page ids outside [0, num_pages)
  // are clamped, so a bad table read by decode gives wrong values but never an out-of-bounds access.
  JAX_FLASH_HOST_DEVICE int64_t offset(int64_t b, int64_t j, int64_t h) const {
    int64_t id = page(b, j);
    id = id < 0 ? 0 : (id >= num_pages ? num_pages - 1 : id);
    return ((id * page_size + j % page_size) * heads_kv + h) * head_dim;
  }
};

// query [batch, q_len, heads_q, head_dim], out likewise, lse [batch, heads_q, q_len] float32. Sequence b holds
// lengths[b] valid cache entries (clamped to [0, capacity]); its q_len queries are the last q_len of them, so query i
// sits at position lengths[b] - q_len + i and sees key j when key_visible(mask, position, j), with the mask's
// window_right 0 (causal). A query with no visible key gets out 0 and lse -inf.
struct DecodeParams {
  DType dtype;
  int64_t batch;
  int64_t q_len;
  int64_t heads_q;
  PagedCache cache;
  AttentionMask mask;
  float scale;
  const void* q;
  const void* k;
  const void* v;
  const int32_t* lengths;  // [batch]
  void* out;
  float* lse;

  JAX_FLASH_HOST_DEVICE int64_t group() const { return heads_q / cache.heads_kv; }

  JAX_FLASH_HOST_DEVICE int64_t length(int64_t b) const {
    const int64_t n = lengths[b];
    return n < 0 ? 0 : (n > cache.capacity() ? cache.capacity() : n);
  }
};

// Writes new_k/new_v [batch, new_len, heads_kv, head_dim] into the caches (updated in place: the FFI outputs alias
// them) at positions positions[b] + t. Rows without a slot (PagedCache::holds) are dropped.
struct KvCacheUpdateParams {
  DType dtype;
  int64_t batch;
  int64_t new_len;
  PagedCache cache;
  const void* new_k;
  const void* new_v;
  const int32_t* positions;  // [batch]
  void* k;
  void* v;
};

inline int64_t dtype_bytes(DType dtype) { return dtype == DType::kFloat32 ? 4 : 2; }

}  // namespace jax_flash
