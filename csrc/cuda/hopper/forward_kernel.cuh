// The Hopper forward kernel, persistent: one CTA per SM runs (query tile, head, batch) work tiles from work_tiles.cuh
// until none is left. Warpgroup 0 is the producer: one thread issues TMA loads of each work tile's query tile (into
// kQBuffers buffers taken in turn, each guarded by a "full" and an "empty" mbarrier, so the next query tile loads
// while the consumers finish the last one) and of key/value tiles into a ring of kStages buffers, each guarded by a
// "full" mbarrier (TMA bytes landed) and an "empty" one (every consumer thread is done reading). The consumer
// warpgroups each own 64 query rows and run
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
#include "fp8_operand.cuh"
#include "online_softmax.cuh"
#include "../tile_mask.cuh"
#include "tile_tickets.cuh"
#include "token_entries.cuh"
#include "warpgroup_gemm.cuh"
#include "work_tiles.cuh"

namespace jax_flash::cuda_kernels::hopper {

template <class Config>
struct ForwardKernelParams {
  typename Config::TmaQ tma_q;
  typename Config::TmaKV tma_k;
  typename Config::TmaV tma_v;
  typename Config::TmaOutput tma_output;  // when Config::kStagedOutput
  GlobalShape shape_q;  // (seqlen_q, head_dim, heads_q, batch)
  GlobalShape shape_kv;
  GlobalShape shape_vt;  // FP8: (head_dim, padded keys, heads_kv, batch) of the transposed v
  const float* descale;  // FP8: {query_scale * key_scale, value_scale}, on the device (the scales may be traced)
  void* out;  // [batch, seqlen_q, heads_q, head_dim]
  float* lse;  // [batch, heads_q, seqlen_q]
  int seqlen_q, seqlen_k, heads_q, group, head_dim;
  AttentionMask mask;
  TokenMask tokens;  // with its chunk summaries; none of it set for dense calls
  bool has_tokens;
  float scale;
  float scale_log2;  // of the score that reaches the softmax: scale * log2(e), or log2(e) after a softcap
  WorkOrder order;
  int* work_counter;  // zero at launch: work tiles handed out past the first gridDim.x
  bool pingpong;
};

// Pingpong between the two consumer warpgroups: each issues its GEMMs only on its turn and then hands the turn over,
// so one warpgroup's wgmma runs while the other does its softmax instead of both contending at once. Turns are
// named barriers (ids 0 and 1 past CUTLASS's reserved ones) of the 256 consumer threads. The turns run on across work
// tiles: both warpgroups take the same number per tile, so the first warpgroup's first GEMM of the next tile waits
// only for the second's last P V of this one, and overlaps the second's output store.
template <int kConsumerWarpgroups>
struct GemmTurns {
  bool enabled;
  int warpgroup;
  __device__ void start() const {  // once per kernel: the second warpgroup lets the first go first
    if (enabled && warpgroup == 1) cutlass::arch::NamedBarrier::arrive(2 * 128, 0);
  }
  __device__ void wait_mine() const {
    if (enabled) cutlass::arch::NamedBarrier::sync(2 * 128, warpgroup);
  }
  __device__ void pass() const {
    if (enabled) cutlass::arch::NamedBarrier::arrive(2 * 128, warpgroup ^ 1);
  }
  __device__ void finish() const {  // once per kernel: the first warpgroup takes the last hand-over, none left pending
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

// Position in a ring of buffers (the key/value stages, or the query buffers): which buffer, and the parity of the
// phase of the barrier waited on next.
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

// The producer's place in the key/value ring and in the query buffers' handovers, carried across work tiles. It
// waits on "empty" barriers, and a fresh one counts as released once.
template <class Config>
struct ProducerState {
  RingCursor<Config::kStages> kv{0, 1};
  RingCursor<Config::kQBuffers> q{0, 1};
};

// Query buffer `buffer` of the kQBuffers, as the producer loads it and the consumers read it.
template <class Config>
__device__ __forceinline__ auto query_buffer(typename Config::SharedStorage& smem, int buffer) {
  using SmemLayoutQ = typename Config::SmemLayoutQ;
  return make_tensor(make_smem_ptr(smem.q.data() + buffer * cosize_v<SmemLayoutQ>), SmemLayoutQ{});
}

// One work tile's loads, run by the producer warpgroup's first warp: lane 0 issues them, and under a token mask every
// lane helps classify key tiles.
template <class Config>
__device__ void produce_tile(const ForwardKernelParams<Config>& p, typename Config::SharedStorage& smem,
                             int work_index, ProducerState<Config>& state) {
  constexpr int kBlockM = Config::kBlockM, kBlockN = Config::kBlockN, kHeadDim = Config::kHeadDim;
  const WorkTile work = p.order.tile(work_index);
  const int q_buffer = state.q.stage;
  Tensor sQ = query_buffer<Config>(smem, q_buffer);
  Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Config::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(smem.v.data()), typename Config::SmemLayoutV{});
  Tensor gQ = local_tile(p.tma_q.get_tma_tensor(p.shape_q)(_, _, work.head, work.batch),
                         Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(work.m_block, _0{}));
  const int head_kv = work.head / p.group;
  Tensor gK = local_tile(p.tma_k.get_tma_tensor(p.shape_kv)(_, _, head_kv, work.batch),
                         Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, _0{}));
  auto value_tiles = [&]() {
    if constexpr (Config::kFp8) {
      return local_tile(p.tma_v.get_tma_tensor(p.shape_vt)(_, _, head_kv, work.batch),
                        Shape<Int<kHeadDim>, Int<kBlockN>>{}, make_coord(_0{}, _));
    } else {
      return local_tile(p.tma_v.get_tma_tensor(p.shape_kv)(_, _, head_kv, work.batch),
                        Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, _0{}));
    }
  };
  Tensor gV = value_tiles();
  auto q_copy = tma_partition(p.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
  auto k_copy = tma_partition(p.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
  auto v_copy = tma_partition(p.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));

  const bool leader = threadIdx.x == 0;
  // Announces the work tile once the consumers are done with the query tile that last used its buffer, and loads
  // its queries. Every lane keeps the buffer cursor; lane 0 alone waits, posts and issues.
  auto start_work = [&](bool has_keys) {
    const uint32_t q_phase = state.q.phase;
    state.q.advance();
    if (!leader) return;
    cutlass::arch::ClusterBarrier::wait(&smem.q_empty[q_buffer], q_phase);
    WorkTicket::make(work_index, has_keys).post(&smem.work[q_buffer]);
    if (!has_keys) return cutlass::arch::ClusterBarrier::arrive(&smem.q_full[q_buffer]);
    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&smem.q_full[q_buffer], Config::kQBytes);
    copy(p.tma_q.with(smem.q_full[q_buffer]), get<0>(q_copy), get<1>(q_copy));
  };
  // Run by every lane: each keeps the ring position, waits for the stage's release and arrives on its "full"
  // barrier, which completes once all producer lanes have arrived and the TMA bytes have landed. What the lanes
  // write beside K in between (`write_key_tokens`) is thereby ordered after the consumers' last reads of the stage
  // and published with K, each lane through its own wait and arrival. Lane 0 alone posts the ticket and issues.
  auto load_keys_and_values = [&](TileTicket ticket, auto&& write_key_tokens) {
    const int n = ticket.tile(), stage = state.kv.stage;
    cutlass::arch::ClusterBarrier::wait(&smem.k_empty[stage], state.kv.phase);
    write_key_tokens(stage);
    if (leader) {
      ticket.post(&smem.tickets[stage]);
      cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&smem.k_full[stage], Config::kKVBytes);
      copy(p.tma_k.with(smem.k_full[stage]), get<0>(k_copy)(_, n), get<1>(k_copy)(_, stage));
      cutlass::arch::ClusterBarrier::wait(&smem.v_empty[stage], state.kv.phase);
      cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&smem.v_full[stage], Config::kKVBytes);
      copy(p.tma_v.with(smem.v_full[stage]), get<0>(v_copy)(_, n), get<1>(v_copy)(_, stage));
    } else {
      cutlass::arch::ClusterBarrier::arrive(&smem.k_full[stage]);
    }
    state.kv.advance();
  };
  auto no_key_tokens = [](int) {};

  const int row_begin = work.m_block * kBlockM;
  const int row_end = min(row_begin + kBlockM, p.seqlen_q);
  // The key tiles the mask's window allows; under a token mask it applies to positions, unless there are none.
  KeyTiles tiles = visible_key_tiles<kBlockN>(p.mask, row_begin, row_end, p.seqlen_k);
  if (!p.has_tokens) {
    start_work(tiles.begin < tiles.end);
    for (int n = tiles.end - 1; n >= tiles.begin; --n) {
      const int key_begin = n * kBlockN;
      const bool straddles = key_begin + kBlockN > p.seqlen_k ||
                             !tile_inside_window(p.mask, row_begin, row_end, key_begin, key_begin + kBlockN);
      load_keys_and_values(
          TileTicket::make(n, n == tiles.begin, straddles ? TileMasking::kWindow : TileMasking::kNone), no_key_tokens);
    }
    return;
  }
  const TokenRow keys = key_tokens(p, work.batch);
  if (p.tokens.q_positions) tiles = {0, (p.seqlen_k + kBlockN - 1) / kBlockN};
  tiles.end = min(tiles.end, (keys.live + kBlockN - 1) / kBlockN);  // no live key past the length
  const tensor_core::WalkSides sides{query_tokens(p, work.batch), row_begin, row_end, keys, kBlockN, true};
  tensor_core::TileWalk<Config::kWalkChunks> walk;
  int n = walk.first_visible(tiles.begin, tiles.end, sides, p.mask);
  start_work(n < tiles.end);
  while (n < tiles.end) {
    // Before the next search moves the walk's window.
    const TileMasking masking = token_tile_masking(walk, n, p.tokens.q_positions != nullptr);
    const int next = walk.first_visible(n + 1, tiles.end, sides, p.mask);
    // A partial tile's key ids and positions, read by the whole warp in one round trip, so the consumers' element
    // mask reads each column's from shared memory instead of global memory.
    auto stage_key_tokens = [&](int stage) {
      if (masking != TileMasking::kTokens) return;
      for (int i = threadIdx.x % 32; i < kBlockN; i += 32) {
        const tensor_core::TokenAt token = tensor_core::token_at(keys, n * kBlockN + i);
        smem.key_tokens[stage][i] = make_int2(token.segment, token.position);
      }
    };
    load_keys_and_values(TileTicket::make(n, next == tiles.end, masking), stage_key_tokens);
    n = next;
  }
}

// The producer's loop over work tiles. Lane 0 takes the next tile once it has issued this one's last load: taken
// earlier, a tile would wait behind this one while another CTA idles at the end of the kernel. The ring still holds
// loads for the consumers, so the atomic's round trip hides behind their work.
template <class Config>
__device__ void produce(const ForwardKernelParams<Config>& p, typename Config::SharedStorage& smem) {
  ProducerState<Config> state;
  const int tiles = p.order.count();
  for (int work = blockIdx.x; work < tiles;) {
    produce_tile<Config>(p, smem, work, state);
    const int next = threadIdx.x == 0 ? int(gridDim.x) + atomicAdd(p.work_counter, 1) : 0;
    work = __shfl_sync(0xffffffffu, next, 0);
  }
  if (threadIdx.x == 0) {
    const int q_buffer = state.q.stage;
    cutlass::arch::ClusterBarrier::wait(&smem.q_empty[q_buffer], state.q.phase);
    WorkTicket::done().post(&smem.work[q_buffer]);
    cutlass::arch::ClusterBarrier::arrive(&smem.q_full[q_buffer]);
  }
}

// Rows of a query tile that sees no key: output 0 and lse -inf, written by the consumers without touching the
// ring.
template <class Config>
__device__ void write_empty_rows(const ForwardKernelParams<Config>& p, const WorkTile& work, int thread) {
  using Output = typename Config::Output;
  const int row_begin = work.m_block * Config::kBlockM;
  const int rows = min(Config::kBlockM, p.seqlen_q - row_begin);
  auto* out = static_cast<Output*>(p.out);
  for (int i = thread; i < rows * p.head_dim; i += Config::kConsumerThreads) {
    const int row = row_begin + i / p.head_dim;
    out[((int64_t(work.batch) * p.seqlen_q + row) * p.heads_q + work.head) * p.head_dim + i % p.head_dim] =
        Output(0.f);
  }
  for (int i = thread; i < rows; i += Config::kConsumerThreads) {
    p.lse[(int64_t(work.batch) * p.heads_q + work.head) * p.seqlen_q + row_begin + i] = -INFINITY;
  }
}

// Named barrier ids past GemmTurns' two: one per consumer warpgroup, for its output staging.
constexpr int kOutputBarrier = 2;

// A warpgroup's output rows, already divided by their sums, to its shared buffer (stmatrix) and on to global memory
// with one TMA store, issued by its first thread; the buffer's previous store must have read it first.
template <class Config, class Accumulator>
__device__ void store_output_rows(const ForwardKernelParams<Config>& p, typename Config::SharedStorage& smem,
                                  Accumulator const& output, const WorkTile& work, int thread) {
  using Output = typename Config::Output;
  const int warpgroup = thread / 128, warpgroup_thread = thread % 128;
  // The stmatrix copy is laid out for one warpgroup's product; a thread's share of the CTA's is the same fragment.
  static_assert(is_same_v<decltype(output.layout()),
                          decltype(partition_fragment_C(typename Config::MmaPVWarpgroup{},
                                                        Shape<_64, Int<Config::kHeadDim>>{}).layout())>);
  Tensor rounded = make_tensor<Output>(output.layout());
  convert_fragment(output, rounded);
  using OutputLayout = typename Config::SmemLayoutOutput;
  Tensor sO = make_tensor(make_smem_ptr(smem.output.data() + warpgroup * cosize_v<OutputLayout>), OutputLayout{});
  auto to_shared = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Output>{}, typename Config::MmaPVWarpgroup{});
  auto thread_copy = to_shared.get_thread_slice(warpgroup_thread);
  if (warpgroup_thread == 0) tma_store_wait<0>();
  cutlass::arch::NamedBarrier::sync(128, kOutputBarrier + warpgroup);
  copy(to_shared, thread_copy.retile_S(rounded), thread_copy.partition_D(sO));
  cutlass::arch::fence_view_async_shared();  // visible to the TMA (the async proxy)
  cutlass::arch::NamedBarrier::sync(128, kOutputBarrier + warpgroup);
  if (warpgroup_thread == 0) {
    Tensor gO = local_tile(p.tma_output.get_tma_tensor(p.shape_q)(_, _, work.head, work.batch),
                           Shape<_64, Int<Config::kHeadDim>>{},
                           make_coord(work.m_block * Config::kConsumerWarpgroups + warpgroup, _0{}));
    auto [global_box, shared_box] =
        tma_partition(p.tma_output, _0{}, Layout<_1>{}, group_modes<0, 2>(sO), group_modes<0, 2>(gO));
    copy(p.tma_output, shared_box, global_box);
    tma_store_arrive();
  }
}

// One work tile with at least one key tile, its queries landed or landing in the query buffer.
template <class Config>
__device__ void consume_tile(const ForwardKernelParams<Config>& p, typename Config::SharedStorage& smem,
                             const WorkTile& work, int thread, RingCursor<Config::kStages>& k_cursor,
                             RingCursor<Config::kStages>& v_cursor, RingCursor<Config::kQBuffers> q_cursor,
                             const GemmTurns<Config::kConsumerWarpgroups>& turns) {
  using Element = typename Config::Element;
  constexpr int kBlockM = Config::kBlockM, kBlockN = Config::kBlockN, kHeadDim = Config::kHeadDim;
  using Barrier = cutlass::arch::ClusterBarrier;
  const int batch = work.batch, head = work.head;

  Tensor sQ = query_buffer<Config>(smem, q_cursor.stage);
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
  auto operand_layout = [&]() {
    if constexpr (Config::kFp8) {
      return fp8_operand_a(tSrS.layout());
    } else {
      return accumulator_as_operand_a(tSrS.layout());
    }
  };
  Tensor tOrP = make_tensor<Element>(operand_layout());
  Tensor scores = make_tensor(tSrS.data(), accumulator_rows(tSrS.layout()));
  Tensor out_rows = make_tensor(tOrO.data(), accumulator_rows(tOrO.layout()));
  Tensor score_coords = thread_qk.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
  Tensor score_rc = make_tensor(score_coords.data(), accumulator_rows(score_coords.layout()));
  constexpr int kRows = decltype(size<0>(scores))::value;

  const int row_begin = work.m_block * kBlockM;
  // FP8: the logits carry the query and key scales, and P is lifted by kFp8PScale into e4m3's range; the output
  // takes the value scale and drops that factor again.
  constexpr float kFp8PScale = 256.f;
  const float qk_descale = Config::kFp8 ? p.descale[0] : 1.f;
  const float score_scale = p.scale * qk_descale;
  const float output_scale = Config::kFp8 ? p.descale[1] / kFp8PScale : 1.f;

  // Raw scores of the ticket's key tile (in ring stage `stage`), soft-capped, with invisible keys at -inf where the
  // ticket asks for a mask. The stage is released after this: a partial tile's key tokens are staged beside K.
  auto prepare_scores = [&](TileTicket ticket, int stage) {
    if (p.mask.softcap > 0.f) {
      const float inverse_cap = score_scale / p.mask.softcap;
      CUTE_UNROLL
      for (int i = 0; i < size(tSrS); ++i) {
        tSrS(i) = p.mask.softcap * tensor_core::tanh_fast(tSrS(i) * inverse_cap);
      }
    }
    const int key_begin = ticket.tile() * kBlockN;
    if (ticket.masking() == TileMasking::kWindow) {
      // int32 compares of tile-relative coordinates (tile_mask.cuh): the causal diagonal of every work tile runs
      // this, on the path from its Q K^T to its softmax.
      const TileMask tile_mask(p.mask, p.seqlen_k, row_begin, key_begin);
      CUTE_UNROLL
      for (int r = 0; r < size<0>(scores); ++r) {
        const TileMask::KeyRange seen = tile_mask.keys_seen_by(get<0>(score_rc(r, 0)));
        CUTE_UNROLL
        for (int c = 0; c < size<1>(scores); ++c) {
          const int key = get<1>(score_rc(r, c));
          if (key < seen.first || key > seen.last) scores(r, c) = -INFINITY;
        }
      }
    } else if (ticket.masking() == TileMasking::kTokens) {
      const int live_keys = key_tokens(p, batch).live - key_begin;
      const int2* staged = smem.key_tokens[stage];
      hide_unseen_keys(
          scores, score_rc, query_tokens(p, batch), row_begin,
          [&](int key) {
            const int2 token = staged[key];
            return tensor_core::TokenAt{key < live_keys, token.x, token.y};
          },
          p.mask, -INFINITY);
    }
  };
  auto to_operand = [&]() {
    if constexpr (Config::kFp8) {
      convert_to_fp8_operand(tSrS, tOrP, kFp8PScale);
    } else {
      convert_fragment(tSrS, tOrP);
    }
  };

  OnlineSoftmax<kRows, Config::kMaxLagLog2> softmax(p.mask.softcap > 0.f ? p.scale_log2 : p.scale_log2 * qk_descale);
  float rescale[kRows];
  clear(tOrO);

  Barrier::wait(&smem.k_full[k_cursor.stage], k_cursor.phase);
  TileTicket ticket = TileTicket::read(&smem.tickets[k_cursor.stage]);
  Barrier::wait(&smem.q_full[q_cursor.stage], q_cursor.phase);
  // The first tile: its scores alone, no P V in flight yet.
  turns.wait_mine();
  warpgroup_gemm<true, -1>(mma_qk, tSrQ, tSrK(_, _, _, k_cursor.stage), tSrS);
  turns.pass();
  warpgroup_wait<0>();
  warpgroup_fence_operand(tSrS);
  prepare_scores(ticket, k_cursor.stage);
  Barrier::arrive(&smem.k_empty[k_cursor.stage]);
  k_cursor.advance();
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
    prepare_scores(ticket, k_cursor.stage);
    Barrier::arrive(&smem.k_empty[k_cursor.stage]);
    k_cursor.advance();
    const bool rescales = softmax.update(scores, rescale);
    warpgroup_wait<0>();  // P V done: its V buffer and the P registers are free again
    warpgroup_fence_operand(tOrO);
    Barrier::arrive(&smem.v_empty[v_cursor.stage]);
    v_cursor.advance();
    if (rescales) {
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        CUTE_UNROLL
        for (int c = 0; c < size<1>(out_rows); ++c) out_rows(r, c) *= rescale[r];
      }
    }
    to_operand();
  }
  Barrier::arrive(&smem.q_empty[q_cursor.stage]);  // every Q K^T of this tile is done: the buffer may load again
  Barrier::wait(&smem.v_full[v_cursor.stage], v_cursor.phase);
  turns.wait_mine();
  warpgroup_gemm<false, -1>(mma_pv, tOrP, tOrV(_, _, _, v_cursor.stage), tOrO);
  turns.pass();
  warpgroup_wait<0>();
  warpgroup_fence_operand(tOrO);
  Barrier::arrive(&smem.v_empty[v_cursor.stage]);
  v_cursor.advance();

  float inverse_sum[kRows], lse[kRows];
  softmax.finish(inverse_sum, lse);
  if constexpr (Config::kStagedOutput) {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      CUTE_UNROLL
      for (int c = 0; c < size<1>(out_rows); ++c) out_rows(r, c) *= inverse_sum[r] * output_scale;
    }
    store_output_rows(p, smem, tOrO, work, thread);
  } else {
    auto* out = static_cast<typename Config::Output*>(p.out);
    store_accumulator<typename Config::Output>(
        tOrO, thread_pv.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{})),
        p.seqlen_q - row_begin, p.head_dim,
        [&](int row) {
          return out + ((int64_t(batch) * p.seqlen_q + row_begin + row) * p.heads_q + head) * p.head_dim;
        },
        [&](int r) { return inverse_sum[r] * output_scale; });
  }
  if (thread % 4 == 0) {  // the quad's first thread writes its rows' lse
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const int row = row_begin + get<0>(score_rc(r, 0));
      if (row < p.seqlen_q) p.lse[(int64_t(batch) * p.heads_q + head) * p.seqlen_q + row] = lse[r];
    }
  }
}

// The consumers' loop over the work tiles the producer announces.
template <class Config>
__device__ void consume(const ForwardKernelParams<Config>& p, typename Config::SharedStorage& smem, int thread) {
  RingCursor<Config::kStages> k_cursor, v_cursor;
  RingCursor<Config::kQBuffers> q_cursor;
  const GemmTurns<Config::kConsumerWarpgroups> turns{Config::kConsumerWarpgroups == 2 && p.pingpong, thread / 128};
  turns.start();
  for (;; q_cursor.advance()) {
    cutlass::arch::ClusterBarrier::wait(&smem.q_full[q_cursor.stage], q_cursor.phase);
    const WorkTicket ticket = WorkTicket::read(&smem.work[q_cursor.stage]);
    if (ticket.is_done()) {
      turns.finish();
      // The output buffers stay in use until their last stores have read them.
      if (Config::kStagedOutput && thread % 128 == 0) tma_store_wait<0>();
      return;
    }
    const WorkTile work = p.order.tile(ticket.index());
    if (ticket.has_keys()) {
      consume_tile<Config>(p, smem, work, thread, k_cursor, v_cursor, q_cursor, turns);
    } else {
      cutlass::arch::ClusterBarrier::arrive(&smem.q_empty[q_cursor.stage]);
      write_empty_rows<Config>(p, work, thread);
    }
  }
}

template <class Config>
__global__ void __launch_bounds__(Config::kThreads, 1)
    forward_kernel(CUTE_GRID_CONSTANT const ForwardKernelParams<Config> p) {
  extern __shared__ char smem_bytes[];
  auto& smem = *reinterpret_cast<typename Config::SharedStorage*>(smem_bytes);
  if (threadIdx.x == 0) {
    cute::prefetch_tma_descriptor(p.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(p.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(p.tma_v.get_tma_descriptor());
    if constexpr (Config::kStagedOutput) cute::prefetch_tma_descriptor(p.tma_output.get_tma_descriptor());
    for (int b = 0; b < Config::kQBuffers; ++b) {
      cutlass::arch::ClusterBarrier::init(&smem.q_full[b], 1);
      cutlass::arch::ClusterBarrier::init(&smem.q_empty[b], Config::kConsumerThreads);
    }
    for (int s = 0; s < Config::kStages; ++s) {
      cutlass::arch::ClusterBarrier::init(&smem.k_full[s], Config::kProducerLanes);
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
    if (threadIdx.x < 32) produce<Config>(p, smem);
  } else {
    cutlass::arch::warpgroup_reg_alloc<Config::kConsumerRegisters>();
    consume<Config>(p, smem, threadIdx.x - 128);
  }
}

}  // namespace jax_flash::cuda_kernels::hopper
