// The Hopper forward kernel. Warpgroup 0 is the producer: one thread issues TMA loads of the query tile once and of
// key/value tiles into a ring of kStages buffers, each guarded by a "full" mbarrier (TMA bytes landed) and an
// "empty" one (every consumer thread is done reading). The consumer warpgroups each own 64 query rows and run
//   S_j = Q K_j^T  (wgmma, async)  |  O += P_{j+1} V_{j+1}  (wgmma, async)  |  softmax(S_j) while the latter runs,
// over the key tiles the producer picks and announces per stage (tile_tickets.cuh). Without a token mask it walks them
// from the last to the first, so the tiles that need element masks (sequence end, causal diagonal) come first; under
// a token mask (lengths, segment ids, positions) its warp classifies key tiles 32 at a time from the per-call chunk
// summaries (token_tiles.cuh), loads only the non-empty ones and marks the partial ones for an element mask.
#pragma once

#include <cmath>
#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include "../../attention_mask.h"
#include "../tensor_core/ptx.cuh"
#include "forward_config.cuh"
#include "accumulator_store.cuh"
#include "online_softmax.cuh"
#include "tile_tickets.cuh"
#include "token_entries.cuh"
#include "warpgroup_gemm.cuh"

namespace jax_flash::cuda_kernels::hopper {

template <class Config>
struct ForwardKernelParams {
  typename Config::TmaQ tma_q;
  typename Config::TmaKV tma_k;
  typename Config::TmaKV tma_v;
  GlobalShape shape_q;  // (seqlen_q, head_dim, heads_q, batch)
  GlobalShape shape_kv;
  void* out;  // [batch, seqlen_q, heads_q, head_dim]
  float* lse;  // [batch, heads_q, seqlen_q]
  int seqlen_q, seqlen_k, heads_q, group, head_dim;
  AttentionMask mask;
  TokenMask tokens;  // with its chunk summaries; none of it set for dense calls
  bool has_tokens;
  float scale;
  float scale_log2;  // of the score that reaches the softmax: scale * log2(e), or log2(e) after a softcap
  bool heaviest_first;  // launch query tiles in reverse (the last ones see the most keys under a causal mask)
  bool pingpong;
};

// Pingpong between the two consumer warpgroups: each issues its GEMMs only on its turn and then hands the turn over,
// so one warpgroup's wgmma runs while the other does its softmax instead of both contending at once. Turns are
// named barriers (ids 0 and 1 past CUTLASS's reserved ones) of the 256 consumer threads.
template <int kConsumerWarpgroups>
struct GemmTurns {
  bool enabled;
  int warpgroup;
  __device__ void start() const {  // the second warpgroup lets the first go first
    if (enabled && warpgroup == 1) cutlass::arch::NamedBarrier::arrive(2 * 128, 0);
  }
  __device__ void wait_mine() const {
    if (enabled) cutlass::arch::NamedBarrier::sync(2 * 128, warpgroup);
  }
  __device__ void pass() const {
    if (enabled) cutlass::arch::NamedBarrier::arrive(2 * 128, warpgroup ^ 1);
  }
  __device__ void finish() const {  // the first warpgroup takes the last hand-over, so no arrival is left pending
    if (enabled && warpgroup == 0) cutlass::arch::NamedBarrier::sync(2 * 128, 0);
  }
};

// The key tiles [begin, end) the query rows [row_begin, row_end) may see.
struct KeyTiles {
  int begin, end;
};

template <int kBlockN>
__device__ __forceinline__ KeyTiles visible_key_tiles(const AttentionMask& mask, int row_begin, int row_end,
                                                      int seqlen_k) {
  const int64_t key_begin = first_visible_key(mask, row_begin);
  const int64_t key_end = end_visible_key(mask, row_end, seqlen_k);
  return {static_cast<int>(key_begin / kBlockN), static_cast<int>((key_end + kBlockN - 1) / kBlockN)};
}

// The query rows' and keys' token inputs of one batch row (token_tiles.cuh).
template <class Params>
__device__ __forceinline__ TokenRow query_tokens(const Params& p, int batch) {
  return tensor_core::token_row(p.tokens.q_lengths, p.tokens.q_segment_ids, p.tokens.q_positions, p.tokens.q_chunks,
                                p.seqlen_q, batch);
}

template <class Params>
__device__ __forceinline__ TokenRow key_tokens(const Params& p, int batch) {
  return tensor_core::token_row(p.tokens.kv_lengths, p.tokens.kv_segment_ids, p.tokens.kv_positions,
                                p.tokens.kv_chunks, p.seqlen_k, batch);
}

// Run by the producer warpgroup's first warp: lane 0 issues the loads, and under a token mask every lane helps
// classify key tiles.
template <class Config>
__device__ void produce(const ForwardKernelParams<Config>& p, typename Config::SharedStorage& smem, int m_block,
                        int head, int batch) {
  constexpr int kBlockM = Config::kBlockM, kBlockN = Config::kBlockN, kHeadDim = Config::kHeadDim;
  Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Config::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Config::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(smem.v.data()), typename Config::SmemLayoutV{});
  Tensor gQ = local_tile(p.tma_q.get_tma_tensor(p.shape_q)(_, _, head, batch),
                         Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(m_block, _0{}));
  const int head_kv = head / p.group;
  Tensor gK = local_tile(p.tma_k.get_tma_tensor(p.shape_kv)(_, _, head_kv, batch),
                         Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, _0{}));
  Tensor gV = local_tile(p.tma_v.get_tma_tensor(p.shape_kv)(_, _, head_kv, batch),
                         Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, _0{}));
  auto q_copy = tma_partition(p.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
  Tensor tQgQ = get<0>(q_copy);
  Tensor tQsQ = get<1>(q_copy);
  auto k_copy = tma_partition(p.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
  Tensor tKgK = get<0>(k_copy);
  Tensor tKsK = get<1>(k_copy);
  auto v_copy = tma_partition(p.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));
  Tensor tVgV = get<0>(v_copy);
  Tensor tVsV = get<1>(v_copy);

  const bool leader = threadIdx.x == 0;
  int stage = 0;
  uint32_t phase = 1;  // a fresh "empty" barrier counts as released once
  auto load_query = [&] {
    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&smem.q_full, Config::kQBytes);
    copy(p.tma_q.with(smem.q_full), tQgQ, tQsQ);
  };
  auto load_keys_and_values = [&](TileTicket ticket) {
    const int n = ticket.tile();
    cutlass::arch::ClusterBarrier::wait(&smem.k_empty[stage], phase);
    ticket.post(&smem.tickets[stage]);
    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&smem.k_full[stage], Config::kKVBytes);
    copy(p.tma_k.with(smem.k_full[stage]), tKgK(_, n), tKsK(_, stage));
    cutlass::arch::ClusterBarrier::wait(&smem.v_empty[stage], phase);
    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&smem.v_full[stage], Config::kKVBytes);
    copy(p.tma_v.with(smem.v_full[stage]), tVgV(_, n), tVsV(_, stage));
    if (++stage == Config::kStages) {
      stage = 0;
      phase ^= 1;
    }
  };
  auto post_no_tiles = [&] {
    TileTicket::none().post(&smem.tickets[0]);
    cutlass::arch::ClusterBarrier::arrive(&smem.k_full[0]);
  };

  const int row_begin = m_block * kBlockM;
  const int row_end = min(row_begin + kBlockM, p.seqlen_q);
  if (!p.has_tokens) {
    if (!leader) return;
    const KeyTiles tiles = visible_key_tiles<kBlockN>(p.mask, row_begin, row_end, p.seqlen_k);
    if (tiles.end <= tiles.begin) return post_no_tiles();
    load_query();
    for (int n = tiles.end - 1; n >= tiles.begin; --n) {
      const int key_begin = n * kBlockN;
      const bool straddles = key_begin + kBlockN > p.seqlen_k ||
                             !tile_inside_window(p.mask, row_begin, row_end, key_begin, key_begin + kBlockN);
      load_keys_and_values(
          TileTicket::make(n, n == tiles.begin, straddles ? TileMasking::kWindow : TileMasking::kNone));
    }
    return;
  }
  // The window applies to positions here, so every key tile is a candidate; the walk skips the empty ones.
  const tensor_core::WalkSides sides{query_tokens(p, batch), row_begin, row_end, key_tokens(p, batch), kBlockN, true};
  const int tiles_end = (p.seqlen_k + kBlockN - 1) / kBlockN;
  tensor_core::TileWalk walk;
  int n = walk.first_visible(0, tiles_end, sides, p.mask);
  if (n == tiles_end) {
    if (leader) post_no_tiles();
    return;
  }
  if (leader) load_query();
  while (n < tiles_end) {
    const bool full = walk.full(n);  // before the next search moves the walk's window
    const int next = walk.first_visible(n + 1, tiles_end, sides, p.mask);
    if (leader) load_keys_and_values(TileTicket::make(n, next == tiles_end, full ? TileMasking::kNone : TileMasking::kTokens));
    n = next;
  }
}

// Position in the consumers' walk over the ring: which buffer, and the parity of its "full" barrier's phase.
template <int kStages>
struct RingCursor {
  int stage = 0;
  uint32_t phase = 0;
  __device__ void advance() {
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1;
    }
  }
};

// Rows of a query tile that sees no key: output 0 and lse -inf, written by the consumers without touching the
// ring.
template <class Config>
__device__ void write_empty_rows(const ForwardKernelParams<Config>& p, int m_block, int head, int batch,
                                 int thread) {
  using Element = typename Config::Element;
  const int row_begin = m_block * Config::kBlockM;
  const int rows = min(Config::kBlockM, p.seqlen_q - row_begin);
  auto* out = static_cast<Element*>(p.out);
  for (int i = thread; i < rows * p.head_dim; i += Config::kConsumerThreads) {
    const int row = row_begin + i / p.head_dim;
    out[((int64_t(batch) * p.seqlen_q + row) * p.heads_q + head) * p.head_dim + i % p.head_dim] = Element(0.f);
  }
  for (int i = thread; i < rows; i += Config::kConsumerThreads) {
    p.lse[(int64_t(batch) * p.heads_q + head) * p.seqlen_q + row_begin + i] = -INFINITY;
  }
}

template <class Config>
__device__ void consume(const ForwardKernelParams<Config>& p, typename Config::SharedStorage& smem, int m_block,
                        int head, int batch, int thread) {
  using Element = typename Config::Element;
  constexpr int kBlockM = Config::kBlockM, kBlockN = Config::kBlockN, kHeadDim = Config::kHeadDim;
  using Barrier = cutlass::arch::ClusterBarrier;

  Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Config::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Config::SmemLayoutK{});
  Tensor sVt = make_tensor(make_smem_ptr(smem.v.data()), typename Config::SmemLayoutVt{});
  typename Config::MmaQK mma_qk;
  typename Config::MmaPV mma_pv;
  auto thread_qk = mma_qk.get_thread_slice(thread);
  auto thread_pv = mma_pv.get_thread_slice(thread);
  Tensor tSrQ = thread_qk.partition_fragment_A(sQ);
  Tensor tSrK = thread_qk.partition_fragment_B(sK);   // (MMA, N, K, stage)
  Tensor tOrV = thread_pv.partition_fragment_B(sVt);  // (MMA, N, K, stage)
  Tensor tSrS = partition_fragment_C(mma_qk, Shape<Int<kBlockM>, Int<kBlockN>>{});
  Tensor tOrO = partition_fragment_C(mma_pv, Shape<Int<kBlockM>, Int<kHeadDim>>{});
  Tensor tOrP = make_tensor<Element>(accumulator_as_operand_a(tSrS.layout()));
  Tensor scores = make_tensor(tSrS.data(), accumulator_rows(tSrS.layout()));
  Tensor out_rows = make_tensor(tOrO.data(), accumulator_rows(tOrO.layout()));
  Tensor score_coords = thread_qk.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
  Tensor score_rc = make_tensor(score_coords.data(), accumulator_rows(score_coords.layout()));
  constexpr int kRows = decltype(size<0>(scores))::value;

  const int row_begin = m_block * kBlockM;

  // Raw scores of the ticket's key tile, soft-capped, with invisible keys at -inf where the ticket asks for a mask.
  auto prepare_scores = [&](TileTicket ticket) {
    if (p.mask.softcap > 0.f) {
      const float inverse_cap = p.scale / p.mask.softcap;
      CUTE_UNROLL
      for (int i = 0; i < size(tSrS); ++i) {
        tSrS(i) = p.mask.softcap * tensor_core::tanh_fast(tSrS(i) * inverse_cap);
      }
    }
    const int key_begin = ticket.tile() * kBlockN;
    if (ticket.masking() == TileMasking::kWindow) {
      CUTE_UNROLL
      for (int r = 0; r < size<0>(scores); ++r) {
        CUTE_UNROLL
        for (int c = 0; c < size<1>(scores); ++c) {
          const int row = row_begin + get<0>(score_rc(r, c));
          const int key = key_begin + get<1>(score_rc(r, c));
          if (key >= p.seqlen_k || !key_visible(p.mask, row, key)) scores(r, c) = -INFINITY;
        }
      }
    } else if (ticket.masking() == TileMasking::kTokens) {
      const uint64_t visible = visible_token_entries<false>(score_rc, query_tokens(p, batch), row_begin,
                                                            key_tokens(p, batch), key_begin, p.mask);
      hide_entries(scores, visible, -INFINITY);
    }
  };
  auto to_operand = [&]() { convert_fragment(tSrS, tOrP); };

  OnlineSoftmax<kRows> softmax(p.scale_log2);
  float rescale[kRows];
  clear(tOrO);
  RingCursor<Config::kStages> k_cursor, v_cursor;

  Barrier::wait(&smem.k_full[k_cursor.stage], k_cursor.phase);
  TileTicket ticket = TileTicket::read(&smem.tickets[k_cursor.stage]);
  if (ticket.is_none()) return write_empty_rows<Config>(p, m_block, head, batch, thread);
  const GemmTurns<Config::kConsumerWarpgroups> turns{Config::kConsumerWarpgroups == 2 && p.pingpong, thread / 128};
  turns.start();
  Barrier::wait(&smem.q_full, 0);
  // The first tile: its scores alone, no P V in flight yet.
  turns.wait_mine();
  warpgroup_gemm<true, -1>(mma_qk, tSrQ, tSrK(_, _, _, k_cursor.stage), tSrS);
  turns.pass();
  warpgroup_wait<0>();
  warpgroup_fence_operand(tSrS);
  Barrier::arrive(&smem.k_empty[k_cursor.stage]);
  k_cursor.advance();
  prepare_scores(ticket);
  softmax.update(scores, rescale);
  to_operand();

  while (!ticket.last()) {
    Barrier::wait(&smem.k_full[k_cursor.stage], k_cursor.phase);
    ticket = TileTicket::read(&smem.tickets[k_cursor.stage]);
    Barrier::wait(&smem.v_full[v_cursor.stage], v_cursor.phase);
    turns.wait_mine();
    warpgroup_gemm<true, -1>(mma_qk, tSrQ, tSrK(_, _, _, k_cursor.stage), tSrS);
    warpgroup_gemm<false, -1>(mma_pv, tOrP, tOrV(_, _, _, v_cursor.stage), tOrO);
    turns.pass();
    warpgroup_wait<1>();  // S done; P V may still run
    warpgroup_fence_operand(tSrS);
    Barrier::arrive(&smem.k_empty[k_cursor.stage]);
    k_cursor.advance();
    prepare_scores(ticket);
    softmax.update(scores, rescale);
    warpgroup_wait<0>();  // P V done: its V buffer and the P registers are free again
    warpgroup_fence_operand(tOrO);
    Barrier::arrive(&smem.v_empty[v_cursor.stage]);
    v_cursor.advance();
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      CUTE_UNROLL
      for (int c = 0; c < size<1>(out_rows); ++c) out_rows(r, c) *= rescale[r];
    }
    to_operand();
  }
  Barrier::wait(&smem.v_full[v_cursor.stage], v_cursor.phase);
  turns.wait_mine();
  warpgroup_gemm<false, -1>(mma_pv, tOrP, tOrV(_, _, _, v_cursor.stage), tOrO);
  turns.pass();
  warpgroup_wait<0>();
  warpgroup_fence_operand(tOrO);
  Barrier::arrive(&smem.v_empty[v_cursor.stage]);
  turns.finish();

  float inverse_sum[kRows], lse[kRows];
  softmax.finish(inverse_sum, lse);
  auto* out = static_cast<Element*>(p.out);
  store_accumulator<Element>(
      tOrO, thread_pv.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{})),
      p.seqlen_q - row_begin, p.head_dim,
      [&](int row) { return out + ((int64_t(batch) * p.seqlen_q + row_begin + row) * p.heads_q + head) * p.head_dim; },
      [&](int r) { return inverse_sum[r]; });
  if (thread % 4 == 0) {  // the quad's first thread writes its rows' lse
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const int row = row_begin + get<0>(score_rc(r, 0));
      if (row < p.seqlen_q) p.lse[(int64_t(batch) * p.heads_q + head) * p.seqlen_q + row] = lse[r];
    }
  }
}

template <class Config>
__global__ void __launch_bounds__(Config::kThreads, 1)
    forward_kernel(CUTE_GRID_CONSTANT const ForwardKernelParams<Config> p) {
  extern __shared__ char smem_bytes[];
  auto& smem = *reinterpret_cast<typename Config::SharedStorage*>(smem_bytes);
  const int m_block = p.heaviest_first ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int head = blockIdx.y, batch = blockIdx.z;
  if (threadIdx.x == 0) {
    cute::prefetch_tma_descriptor(p.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(p.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(p.tma_v.get_tma_descriptor());
    cutlass::arch::ClusterBarrier::init(&smem.q_full, 1);
    for (int s = 0; s < Config::kStages; ++s) {
      cutlass::arch::ClusterBarrier::init(&smem.k_full[s], 1);
      cutlass::arch::ClusterBarrier::init(&smem.v_full[s], 1);
      cutlass::arch::ClusterBarrier::init(&smem.k_empty[s], Config::kConsumerThreads);
      cutlass::arch::ClusterBarrier::init(&smem.v_empty[s], Config::kConsumerThreads);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Config::kProducerRegisters>();
    if (threadIdx.x < 32) produce<Config>(p, smem, m_block, head, batch);
  } else {
    cutlass::arch::warpgroup_reg_alloc<Config::kConsumerRegisters>();
    consume<Config>(p, smem, m_block, head, batch, threadIdx.x - 128);
  }
}

}  // namespace jax_flash::cuda_kernels::hopper
