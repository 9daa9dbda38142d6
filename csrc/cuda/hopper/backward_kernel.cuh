// The Hopper backward: one kernel template, two sides (backward_config.cuh) and four roles (BackwardRole).
//   key-major   (dK, dV): S^T = K Q^T, dP^T = V dO^T, then dV += P^T dO and dK += dS^T Q, summed over the query
//                         heads of the KV group and over query tiles inside the CTA; where the two accumulators do
//                         not fit in registers together (head dim 256) it runs twice, dV alone (no dP needed) then dK;
//   query-major (dQ):     S = Q K^T, dP = dO V^T, then dQ += dS K over key tiles;
//   fused       (all):    the key-major kernel that also adds each streamed tile's dQ = dS K into a float32 sum
//                         (query_gradient_sum.cuh: a shared block per tile, bulk-added by a producer-side warp), so no
//                         query-major kernel runs (not bitwise deterministic).
// with P = exp2(S * scale_log2 - lse_log2) and dS = P (dP - delta), times the soft-cap slope when capped. A producer
// warpgroup streams the second operand pair through the TMA ring; rows/keys past the sequence load as zeros, so
// they add nothing to the stored gradients and need no mask. As in the forward, the producer picks the streamed tiles
// and announces each with a ticket (tile_tickets.cuh): a dense range (also under a mask of lengths alone, over each
// row's live tokens), or under segment ids or positions the non-empty tiles of a walk over the per-call chunk
// summaries, partial ones marked for an element mask.
#pragma once

#include <cmath>
#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include "../../attention_mask.h"
#include "../tensor_core/ptx.cuh"
#include "accumulator_store.cuh"
#include "backward_config.cuh"
#include "../tile_mask.cuh"
#include "forward_kernel.cuh"
#include "online_softmax.cuh"
#include "tile_tickets.cuh"
#include "token_entries.cuh"
#include "warpgroup_gemm.cuh"

namespace jax_flash::cuda_kernels::hopper {

enum class BackwardRole { kKeysAndValues, kValues, kKeys, kQueries, kFused };

template <BackwardRole kRole>
inline constexpr bool kKeyMajorRole = kRole != BackwardRole::kQueries;

template <class Config>
struct BackwardKernelParams {
  typename Config::TmaResident tma_resident_a, tma_resident_b;
  typename Config::TmaStreamed tma_streamed_a, tma_streamed_b;
  typename Config::TmaStats tma_lse, tma_delta;  // key-major only
  GlobalShape shape_resident, shape_streamed;
  RowStatsShape shape_stats;  // (padded seqlen_q, heads_q, batch)
  const float* lse_log2;  // [batch, heads_q, padded seqlen_q]: lse * log2(e), +inf for rows with no gradient
  const float* delta;     // [batch, heads_q, padded seqlen_q]
  void* grad_a;  // dK (key-major) or dQ, [batch, rows, heads, head_dim]
  void* grad_b;  // dV (key-major)
  float* query_gradient_sum;  // fused: tiled as query_gradient_sum.cuh says, zeroed before the launch
  int seqlen_q, seqlen_k, heads_q, group, head_dim, padded_seqlen_q;
  AttentionMask mask;
  TokenMask tokens;  // with its chunk summaries; none of it set for dense calls
  bool has_tokens;
  float scale;
  float scale_log2;
};

// Which streamed tiles a CTA visits, in order: for the key-major role, every query head of the KV group times the
// query tiles that see the CTA's keys; for the query-major role, the key tiles its queries see.
template <bool kKeyMajor, int kResident, int kStreamed>
struct StreamedWalk {
  int tile_begin, tile_end, heads;
  __device__ StreamedWalk(const AttentionMask& mask, int resident_begin, int resident_end, int seqlen_q,
                          int seqlen_k, int group) {
    if constexpr (kKeyMajor) {
      const int64_t first = first_row_seeing(mask, resident_begin);
      const int64_t end = end_row_seeing(mask, resident_end, seqlen_q);
      tile_begin = int(first / kStreamed);
      tile_end = first < end ? int((end + kStreamed - 1) / kStreamed) : tile_begin;
      heads = group;
    } else {
      const KeyTiles tiles = visible_key_tiles<kStreamed>(mask, resident_begin, resident_end, seqlen_k);
      tile_begin = tiles.begin;
      tile_end = max(tiles.end, tiles.begin);
      heads = 1;
    }
  }
  __device__ int steps() const { return heads * (tile_end - tile_begin); }
  __device__ int tile(int step) const { return tile_begin + step % (tile_end - tile_begin); }
  __device__ int head_offset(int step) const { return step / (tile_end - tile_begin); }
};

// A mask of sequence lengths alone (no segment ids, no positions) needs no walk over the chunk summaries: each
// batch row is then a dense problem over its live queries and keys, walked like one.
__device__ __forceinline__ bool lengths_only(const TokenMask& tokens) {
  return !tokens.q_segment_ids && !tokens.q_positions;  // ids and positions come in (query, key) pairs
}

template <bool kKeyMajor, class Config>
__device__ void produce_backward(const BackwardKernelParams<Config>& p, typename Config::SharedStorage& smem,
                                 int resident_block, int head, int batch) {
  constexpr int kResident = Config::kResident, kStreamed = Config::kStreamed, kHeadDim = Config::kHeadDim;
  Tensor sRa = make_tensor(make_smem_ptr(smem.resident_a.data()), take<0, 2>(typename Config::ResidentLayout{}));
  Tensor sRb = make_tensor(make_smem_ptr(smem.resident_b.data()), take<0, 2>(typename Config::ResidentLayout{}));
  Tensor sSa = make_tensor(make_smem_ptr(smem.streamed_a.data()), typename Config::StreamedLayout{});
  Tensor sSb = make_tensor(make_smem_ptr(smem.streamed_b.data()), typename Config::StreamedLayout{});
  // Resident rows belong to `head` (a KV head when key-major, a query head otherwise).
  auto resident_tile = [&](auto const& tma) {
    return local_tile(tma.get_tma_tensor(p.shape_resident)(_, _, head, batch),
                      Shape<Int<kResident>, Int<kHeadDim>>{}, make_coord(resident_block, _0{}));
  };
  auto load_resident = [&] {
    auto [tRgA, tRsA] = tma_partition(p.tma_resident_a, _0{}, Layout<_1>{}, group_modes<0, 2>(sRa),
                                      group_modes<0, 2>(resident_tile(p.tma_resident_a)));
    auto [tRgB, tRsB] = tma_partition(p.tma_resident_b, _0{}, Layout<_1>{}, group_modes<0, 2>(sRb),
                                      group_modes<0, 2>(resident_tile(p.tma_resident_b)));
    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&smem.resident_full, 2 * Config::kResidentBytes);
    copy(p.tma_resident_a.with(smem.resident_full), tRgA, tRsA);
    copy(p.tma_resident_b.with(smem.resident_full), tRgB, tRsB);
  };

  const auto stats_layout = make_layout(Shape<Int<kStreamed>, Int<Config::kStages>>{});  // [stage][row]
  Tensor sLse = make_tensor(make_smem_ptr(&smem.lse[0][0]), stats_layout);
  Tensor sDelta = make_tensor(make_smem_ptr(&smem.delta[0][0]), stats_layout);
  constexpr uint32_t kStepBytes = 2 * Config::kStreamedBytes + (kKeyMajor ? 2 * Config::kStatsBytes : 0);
  int stage = 0;
  uint32_t phase = 1;  // a fresh "empty" barrier counts as released once
  // One ring stage: the streamed tile of the KV group's query head `head_offset` (key-major), or of the KV head.
  auto load_step = [&](int head_offset, TileTicket ticket) {
    const int tile = ticket.tile();
    // Key-major CTAs read the query heads head * group + g; query-major ones the KV head head / group.
    const int streamed_head = kKeyMajor ? head * p.group + head_offset : head / p.group;
    auto streamed_tile = [&](auto const& tma) {
      return local_tile(tma.get_tma_tensor(p.shape_streamed)(_, _, streamed_head, batch),
                        Shape<Int<kStreamed>, Int<kHeadDim>>{}, make_coord(tile, _0{}));
    };
    auto [tSgA, tSsA] = tma_partition(p.tma_streamed_a, _0{}, Layout<_1>{}, group_modes<0, 2>(sSa),
                                      group_modes<0, 2>(streamed_tile(p.tma_streamed_a)));
    auto [tSgB, tSsB] = tma_partition(p.tma_streamed_b, _0{}, Layout<_1>{}, group_modes<0, 2>(sSb),
                                      group_modes<0, 2>(streamed_tile(p.tma_streamed_b)));
    cutlass::arch::ClusterBarrier::wait(&smem.empty[stage], phase);
    ticket.post(&smem.tickets[stage]);
    publish(&smem.head_offsets[stage], head_offset);
    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&smem.full[stage], kStepBytes);
    copy(p.tma_streamed_a.with(smem.full[stage]), tSgA, tSsA(_, stage));
    copy(p.tma_streamed_b.with(smem.full[stage]), tSgB, tSsB(_, stage));
    if constexpr (kKeyMajor) {
      auto stats_tile = [&](auto const& tma) {
        return local_tile(tma.get_tma_tensor(p.shape_stats)(_, streamed_head, batch), Shape<Int<kStreamed>>{},
                          make_coord(tile));
      };
      auto [tLg, tLs] = tma_partition(p.tma_lse, _0{}, Layout<_1>{}, sLse, stats_tile(p.tma_lse));
      auto [tDg, tDs] = tma_partition(p.tma_delta, _0{}, Layout<_1>{}, sDelta, stats_tile(p.tma_delta));
      copy(p.tma_lse.with(smem.full[stage]), tLg, tLs(_, stage));
      copy(p.tma_delta.with(smem.full[stage]), tDg, tDs(_, stage));
    }
    if (++stage == Config::kStages) {
      stage = 0;
      phase ^= 1;
    }
  };
  // A stage that holds no tile and ends the consumers' loops: the whole walk when it finds no tile, or after a token
  // walk's last tile (posted before the walk knew it was the last).
  auto post_end = [&] {
    cutlass::arch::ClusterBarrier::wait(&smem.empty[stage], phase);
    TileTicket::none().post(&smem.tickets[stage]);
    cutlass::arch::ClusterBarrier::arrive(&smem.full[stage]);
  };

  const bool leader = threadIdx.x == 0;
  const int resident_begin = resident_block * kResident;
  const int resident_end = min(resident_begin + kResident, kKeyMajor ? p.seqlen_k : p.seqlen_q);
  if (!p.has_tokens || lengths_only(p.tokens)) {
    if (!leader) return;
    // The row's live tokens (TokenRow::live: min(seq, length), at least 0); only the lengths are read here.
    const int seqlen_q = query_tokens(p, batch).live, seqlen_k = key_tokens(p, batch).live;
    const int live_end = min(resident_end, kKeyMajor ? seqlen_k : seqlen_q);
    // Query rows past the length need no mask: the forward gave them lse = -inf, so their probabilities are 0.
    const StreamedWalk<kKeyMajor, kResident, kStreamed> walk(p.mask, resident_begin, live_end, seqlen_q, seqlen_k,
                                                             p.group);
    if (live_end <= resident_begin || walk.steps() == 0) return post_end();
    load_resident();
    for (int step = 0; step < walk.steps(); ++step) {
      const int tile = walk.tile(step);
      const int query_begin = kKeyMajor ? tile * kStreamed : resident_begin;
      const int key_begin = kKeyMajor ? resident_begin : tile * kStreamed;
      const int key_end = key_begin + (kKeyMajor ? kResident : kStreamed);
      // Keys past the row's key length load as zeros (past seqlen_k) or hold data (past a shorter length): in
      // the dQ sums (query-major and fused) and in dK and dV their probabilities must be 0.
      const bool straddles =
          key_end > seqlen_k ||
          !tile_inside_window(p.mask, query_begin, query_begin + (kKeyMajor ? kStreamed : kResident), key_begin,
                              key_end);
      load_step(walk.head_offset(step), TileTicket::make(tile, step + 1 == walk.steps(),
                                                         straddles ? TileMasking::kWindow : TileMasking::kNone));
    }
    return;
  }
  // Under a token mask with positions the window applies to them, so every streamed tile is a candidate; without,
  // only those of the dense walk's range, up to the walked side's length. A key-major CTA walks the same query tiles
  // once per query head of its KV group.
  const TokenRow query_row = query_tokens(p, batch), key_row = key_tokens(p, batch);
  const TokenRow& walked_row = kKeyMajor ? query_row : key_row;
  const TokenRow& own_row = kKeyMajor ? key_row : query_row;
  // The resident tile is the own side of every window the walk classifies: its summary is read once, so a window
  // waits for the walked tiles' summaries alone (the consumers run dry while the producer waits).
  const tensor_core::TokenSpan own_span = tensor_core::chunk_span<1>(own_row, resident_begin, resident_end);
  const tensor_core::WalkSides sides{own_row,   resident_begin, resident_end, walked_row,
                                     kStreamed, !kKeyMajor,     &own_span};
  int tiles_begin = 0, tiles_end = ((kKeyMajor ? p.seqlen_q : p.seqlen_k) + kStreamed - 1) / kStreamed;
  if (!p.tokens.q_positions) {
    const StreamedWalk<kKeyMajor, kResident, kStreamed> range(p.mask, resident_begin, resident_end, p.seqlen_q,
                                                              p.seqlen_k, p.group);
    tiles_begin = range.tile_begin;
    tiles_end = range.tile_end;
  }
  tiles_end = min(tiles_end, (walked_row.live + kStreamed - 1) / kStreamed);
  const int heads = kKeyMajor ? p.group : 1;
  tensor_core::TileWalk<> walk;
  int n = walk.first_visible(tiles_begin, tiles_end, sides, p.mask);
  if (n == tiles_end) {
    if (leader) post_end();
    return;
  }
  if (leader) load_resident();
  // Each tile is loaded as soon as it is found, and the search for the next one (window classifications: global
  // loads in a row) runs while the consumers work on it. Its ticket cannot say whether it is the last, so an end
  // stage follows the last tile (the dense walk knows its last tile and needs none).
  for (int head_offset = 0;;) {
    // The masking is read before the next search moves the walk's window. A key-major CTA's last block may hold
    // rows past seqlen_k (zeros, outside the walk's summary of its keys): an unmasked tile would give them
    // probabilities, which the fused dQ sum must not see, so such blocks never run unmasked.
    TileMasking masking = token_tile_masking(walk, n, p.tokens.q_positions != nullptr);
    if (kKeyMajor && resident_end - resident_begin < kResident && masking == TileMasking::kNone)
      masking = TileMasking::kTokens;
    if (leader) load_step(head_offset, TileTicket::make(n, false, masking));
    n = walk.first_visible(n + 1, tiles_end, sides, p.mask);
    if (n == tiles_end && head_offset + 1 < heads) {
      ++head_offset;
      n = walk.first_visible(tiles_begin, tiles_end, sides, p.mask);
    }
    if (n == tiles_end) {
      if (leader) post_end();
      return;
    }
  }
}

// stmatrix .x4: four 8 x 8 matrices of 16-bit values, each thread giving one row's shared-memory address.
__device__ __forceinline__ void store_matrices_x4(uint32_t address, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("stmatrix.sync.aligned.x4.m8n8.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(address), "r"(a), "r"(b),
               "r"(c), "r"(d)
               : "memory");
}

// A store by the threads where `predicate` holds, as one predicated instruction: a branch on the thread index inside
// the fused loop (`if (thread == 0) ...`) made ptxas build every wgmma descriptor of that loop in vector registers.
__device__ __forceinline__ void store_shared_if(bool predicate, int64_t* slot, int64_t value) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %0, 0;\n"
      "@p st.shared.b64 [%1], %2;\n"
      "}\n" ::"r"(int(predicate)),
      "r"(static_cast<uint32_t>(__cvta_generic_to_shared(slot))), "l"(value)
      : "memory");
}

template <BackwardRole kRole, bool kCapped, class Config>
__device__ void consume_backward(const BackwardKernelParams<Config>& p, typename Config::SharedStorage& smem,
                                 int resident_block, int head, int batch, int thread) {
  constexpr bool kKeyMajor = kKeyMajorRole<kRole>;
  // gradient A is dK or dQ (needs dS, hence dP); gradient B is dV (needs only P).
  constexpr bool kGradientA = kRole != BackwardRole::kValues;
  constexpr bool kGradientB =
      kRole == BackwardRole::kKeysAndValues || kRole == BackwardRole::kValues || kRole == BackwardRole::kFused;
  constexpr bool kFused = kRole == BackwardRole::kFused;
  using Element = typename Config::Element;
  constexpr int kResident = Config::kResident, kStreamed = Config::kStreamed, kHeadDim = Config::kHeadDim;
  using Barrier = cutlass::arch::ClusterBarrier;

  Tensor sRa = make_tensor(make_smem_ptr(smem.resident_a.data()), take<0, 2>(typename Config::ResidentLayout{}));
  Tensor sRb = make_tensor(make_smem_ptr(smem.resident_b.data()), take<0, 2>(typename Config::ResidentLayout{}));
  Tensor sSa = make_tensor(make_smem_ptr(smem.streamed_a.data()), typename Config::StreamedLayout{});
  Tensor sSb = make_tensor(make_smem_ptr(smem.streamed_b.data()), typename Config::StreamedLayout{});
  Tensor sSat = make_tensor(make_smem_ptr(smem.streamed_a.data()), typename Config::StreamedTransposed{});
  Tensor sSbt = make_tensor(make_smem_ptr(smem.streamed_b.data()), typename Config::StreamedTransposed{});
  typename Config::MmaScores mma_scores;
  typename Config::MmaGradient mma_gradient;
  auto thread_scores = mma_scores.get_thread_slice(thread);
  auto thread_gradient = mma_gradient.get_thread_slice(thread);
  // The fused kernel partitions its shared-memory operands by warpgroup_first_thread, so that its loop builds the
  // wgmma descriptors in uniform registers: 2 R2UR per tile instead of 112, and its forward+backward 2.4-4.1% faster
  // at head dim 128 on an H100 (docs/benchmarks.md, twenty-first session). The other roles keep the thread's own
  // slice: with the warpgroup's, the head dim 64 kernels measured 0-2% slower in the same run.
  const int warpgroup_first = warpgroup_first_thread(thread);
  auto operand_scores = mma_scores.get_thread_slice(kFused ? warpgroup_first : thread);
  Tensor tRa = operand_scores.partition_fragment_A(sRa);
  Tensor tRb = operand_scores.partition_fragment_A(sRb);
  Tensor tSa = operand_scores.partition_fragment_B(sSa);  // (MMA, N, K, stage)
  Tensor tSb = operand_scores.partition_fragment_B(sSb);
  Tensor tSat = thread_gradient.partition_fragment_B(sSat);  // (MMA, N = head_dim, K = streamed rows, stage)
  Tensor tSbt = thread_gradient.partition_fragment_B(sSbt);
  Tensor tS = partition_fragment_C(mma_scores, Shape<Int<kResident>, Int<kStreamed>>{});
  Tensor tdP = partition_fragment_C(mma_scores, Shape<Int<kResident>, Int<kStreamed>>{});
  Tensor tGradA = partition_fragment_C(mma_gradient, Shape<Int<kResident>, Int<kHeadDim>>{});  // dK or dQ
  Tensor tGradB = partition_fragment_C(mma_gradient, Shape<Int<kResident>, Int<kHeadDim>>{});  // dV
  Tensor tP = make_tensor<Element>(accumulator_as_operand_a(tS.layout()));
  Tensor tdS = make_tensor<Element>(accumulator_as_operand_a(tS.layout()));
  Tensor coords = thread_scores.partition_C(make_identity_tensor(Shape<Int<kResident>, Int<kStreamed>>{}));
  // (rows, columns) views of the score tiles, for the token element mask.
  Tensor coord_rows = make_tensor(coords.data(), accumulator_rows(coords.layout()));
  Tensor score_rows = make_tensor(tS.data(), accumulator_rows(tS.layout()));
  Tensor score_gradient_rows = make_tensor(tdP.data(), accumulator_rows(tdP.layout()));
  // The fences keep the zeroing ahead of the first scores' GEMMs: sunk below them, it made ptxas wait for those
  // GEMMs at the loop's entry (C7517) in the query-major kernel.
  if constexpr (kGradientA) clear(tGradA), warpgroup_fence_operand(tGradA);
  if constexpr (kGradientB) clear(tGradB), warpgroup_fence_operand(tGradB);
  // Fused: dS^T goes to a shared buffer (by tile parity) as written by the score accumulator's layout, and each
  // warpgroup reads it back as the A operand of its half of dQ = dS K.
  auto fused_queries = [&] {
    if constexpr (kFused) {
      typename Config::MmaQueries mma_queries;
      auto thread_queries = mma_queries.get_thread_slice(thread);
      auto operand_queries = mma_queries.get_thread_slice(warpgroup_first);  // as operand_scores
      Tensor sdS = make_tensor(make_smem_ptr(smem.score_gradients.data()), typename Config::ScoreGradientLayout{});
      Tensor sdSt =
          make_tensor(make_smem_ptr(smem.score_gradients.data()), typename Config::ScoreGradientTransposed{});
      Tensor sKt = make_tensor(make_smem_ptr(smem.resident_a.data()), typename Config::ResidentTransposed{});
      return cute::make_tuple(mma_queries, operand_queries.partition_fragment_A(sdS),
                              operand_queries.partition_fragment_B(sKt),
                              partition_fragment_C(mma_queries, Shape<Int<kStreamed>, Int<kHeadDim>>{}),
                              thread_queries.partition_C(make_identity_tensor(Shape<Int<kStreamed>, Int<kHeadDim>>{})),
                              sdSt);
    } else {
      return 0;
    }
  }();

  // Fused: dS^T leaves by four stmatrix per thread (score_gradient_targets). Their addresses are the first one's XOR
  // the step (the step's bits are among those the swizzle XORs into, and zero in every thread's first address), and
  // the second buffer's are the first's plus its distance (a multiple of the swizzle's span); checked for every
  // thread by tests/cuda/score_gradient_stores.cu. So the thread's first address is computed once: sliced per tile by
  // the buffer index, CuTe's swizzled pointers rebuilt all four with 64-bit arithmetic every tile.
  auto score_gradient_copy =
      make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_scores).get_thread_slice(thread);
  [[maybe_unused]] const uint32_t score_gradient_row = [&] {
    if constexpr (kFused) {
      return cute::cast_smem_ptr_to_uint(&score_gradient_targets<Config>(thread, smem.score_gradients.data())(0));
    } else {
      return 0u;
    }
  }();

  const int resident_begin = resident_block * kResident;
  const int resident_rows = kKeyMajor ? p.seqlen_k : p.seqlen_q;
  const int resident_end = min(resident_begin + kResident, resident_rows);
  // Query-major rows keep their lse and delta in registers; key-major ones read theirs per streamed tile.
  float row_lse[2] = {0.f, 0.f}, row_delta[2] = {0.f, 0.f};
  if constexpr (!kKeyMajor) {
    const int64_t base = (int64_t(batch) * p.heads_q + head) * p.padded_seqlen_q;
    CUTE_UNROLL
    for (int r = 0; r < 2; ++r) {
      const int row = resident_begin + get<0>(coord_rows(r, 0));
      row_lse[r] = p.lse_log2[base + row];
      row_delta[r] = p.delta[base + row];
    }
  }

  const float cap_input_scale = p.mask.softcap > 0.f ? p.scale / p.mask.softcap : 0.f;
  const int live_keys = key_tokens(p, batch).live;  // the element mask's key limit
  // Software pipeline: the scores and dP of the next streamed tile are issued right behind this tile's gradient
  // GEMMs, so the tensor cores have queued work while the warpgroup waits; P and dS (16-bit registers) stay
  // untouched until every GEMM reading them has retired. It keeps the scores, P/dS and the gradients live at once,
  // which leaves too few registers (ptxas then serializes the wgmma) for the key-major consumers above head dim 64
  // and every consumer at 256; those issue the next scores only after the gradient GEMMs retired.
  constexpr bool kPipelined = kHeadDim <= 64 || (!kKeyMajor && kHeadDim <= 128);
  constexpr int kScoreGemms = kGradientA ? 2 : 1;
  // dS formed after P, under the GEMMs in flight (see the loop), in the fused kernel only: in the others the split
  // waits measured 1-9% slower on the H200 (docs/benchmarks.md, fifth session). Not with a soft cap (its slope needs
  // the raw score, which P overwrites), and not in the pipelined loop: ptxas (nvcc 13.0) then serializes every wgmma
  // (C7515).
  constexpr bool kDeferredScoreGradients = kFused && !kCapped && !kPipelined;
  auto issue_scores = [&](int stage) {
    warpgroup_gemm<true, -1>(mma_scores, tRa, tSa(_, _, _, stage), tS);
    if constexpr (kGradientA) warpgroup_gemm<true, -1>(mma_scores, tRb, tSb(_, _, _, stage), tdP);
  };
  int stage = 0;
  uint32_t phase = 0;
  auto wait_for_ticket = [&] {  // the next stage's loads have landed: what do they hold?
    Barrier::wait(&smem.full[stage], phase);
    return TileTicket::read(&smem.tickets[stage]);
  };
  TileTicket ticket = wait_for_ticket();
  [[maybe_unused]] int ticket_parity = 0;  // fused: which dS buffer this tile uses
  // Fused: where the dQ sum's blocks of this CTA's KV group start (first query head, first tile), in floats.
  constexpr int64_t kSumBlockFloats = kSumTileRows * (kHeadDim + kSumRowPad);
  [[maybe_unused]] const int sum_tiles = sum_query_tiles(p.seqlen_q);
  [[maybe_unused]] const int64_t first_sum_target =
      sum_block(batch, head * p.group, 0, p.heads_q, sum_tiles) * kSumBlockFloats;
  [[maybe_unused]] uint32_t sum_phase = 1;  // fused: the dQ block's "empty" barrier; a fresh one counts as released
  // Fused: this tile's dQ block to shared memory and its place in the sum (or -1: no more) for the dQ writer.
  auto hand_over_query_gradient = [&](auto const& block, int64_t target) {
    if constexpr (kFused) {
      Barrier::wait(&smem.query_gradient_empty, sum_phase);
      sum_phase ^= 1;
      if (target >= 0) {
        for_each_column_pair_of_tile(block, get<4>(fused_queries), [&](int, int row) {
          float* destination = smem.query_gradient[row];
          return [=](int column, float a, float b) {
            *reinterpret_cast<float2*>(destination + column) = make_float2(a, b);
          };
        });
        cutlass::arch::fence_view_async_shared();  // visible to the bulk operation (the async proxy)
      }
      store_shared_if(thread == 0, &smem.query_gradient_target, target);  // no branch: see store_shared_if
      Barrier::arrive(&smem.query_gradient_full);
    }
  };
  if (!ticket.is_none()) {
    Barrier::wait(&smem.resident_full, 0);
    if constexpr (kPipelined) issue_scores(stage);
  }
  while (!ticket.is_none()) {
    if constexpr (!kPipelined) issue_scores(stage);
    // The scores' batch was issued before dP's. Where dS can wait (kDeferredScoreGradients), the exponentials need
    // only S: waiting for all but the newest batch leaves dP's GEMM running under them, and dS is formed later,
    // under dV's GEMM. Otherwise P and dS are formed in one pass once both products have landed.
    warpgroup_wait<kDeferredScoreGradients ? 1 : 0>();
    warpgroup_fence_operand(tS);
    if constexpr (!kDeferredScoreGradients) warpgroup_fence_operand(tdP);

    const int streamed_begin = ticket.tile() * kStreamed;
    const int query_begin = kKeyMajor ? streamed_begin : resident_begin;
    const int key_begin = kKeyMajor ? resident_begin : streamed_begin;
    const bool straddles = ticket.masking() == TileMasking::kWindow;
    const TileMask tile_mask(p.mask, live_keys, query_begin, key_begin);
    // Accumulator element i sits in row half (i / 2) % 2 of the thread's two rows.
    auto lse_of = [&](int i, int streamed) { return kKeyMajor ? smem.lse[stage][streamed] : row_lse[(i / 2) % 2]; };
    auto delta_of = [&](int i, int streamed) {
      return kKeyMajor ? smem.delta[stage][streamed] : row_delta[(i / 2) % 2];
    };
    // P (and, capped, dS) elementwise, straight-line code: the mask test is int32 compares on tile-relative
    // coordinates (a branch and a division per element made the loop overflow the instruction cache). Tiles that
    // need no mask (most of them) take a version of the loop without the test, chosen once per tile.
    auto probabilities = [&](auto masked) {
      CUTE_UNROLL
      for (int i = 0; i < size(tS); ++i) {
        const int resident = get<0>(coords(i)), streamed = get<1>(coords(i));
        float score = tS(i);
        [[maybe_unused]] float slope = 1.f;  // unused where dS is formed later (uncapped)
        if constexpr (kCapped) {
          const float t = tensor_core::tanh_fast(score * cap_input_scale);
          score = p.mask.softcap * t;
          slope = 1.f - t * t;
        }
        float probability = tensor_core::exp2_fast(fmaf(score, p.scale_log2, -lse_of(i, streamed)));
        if constexpr (decltype(masked)::value) {
          const bool visible = tile_mask.visible(kKeyMajor ? streamed : resident, kKeyMajor ? resident : streamed);
          probability = straddles && !visible ? 0.f : probability;  // capped tiles take this version unmasked too
        }
        tS(i) = probability;
        if constexpr (kGradientA && !kDeferredScoreGradients)
          tdP(i) = probability * (tdP(i) - delta_of(i, streamed)) * slope;
      }
    };
    if constexpr (kCapped) {
      probabilities(cute::true_type{});  // one version: a second costs the capped loops registers (spills)
    } else if (straddles) {
      probabilities(cute::true_type{});
    } else {
      probabilities(cute::false_type{});
    }
    uint64_t visible_entries = 0;
    if (ticket.masking() == TileMasking::kTokens) {
      const TokenRow query_row = query_tokens(p, batch), key_row = key_tokens(p, batch);
      visible_entries = visible_token_entries<kKeyMajor>(
          coord_rows, kKeyMajor ? key_row : query_row, resident_begin, kKeyMajor ? query_row : key_row,
          streamed_begin, p.mask);
      hide_entries(score_rows, visible_entries, 0.f);
      if constexpr (kGradientA && !kDeferredScoreGradients) hide_entries(score_gradient_rows, visible_entries, 0.f);
    }
    if constexpr (kGradientB) {
      convert_fragment(tS, tP);
      warpgroup_gemm<false, -1>(mma_gradient, tP, tSbt(_, _, _, stage), tGradB);  // dV += P^T dO
    }
    if constexpr (kGradientA) {
      if constexpr (kDeferredScoreGradients) {
        warpgroup_wait<kGradientB ? 1 : 0>();  // dP has landed; dV's GEMM runs on
        warpgroup_fence_operand(tdP);
        CUTE_UNROLL
        for (int i = 0; i < size(tS); ++i) tdP(i) = tS(i) * (tdP(i) - delta_of(i, get<1>(coords(i))));
        if (ticket.masking() == TileMasking::kTokens) hide_entries(score_gradient_rows, visible_entries, 0.f);
      }
      convert_fragment(tdP, tdS);
      // Fused: dS^T to shared memory now, before a wgmma reads the registers (reading them while one is in flight
      // is undefined); made visible to the wgmma's async proxy.
      if constexpr (kFused) {
        // stmatrix: eight rows of 16 bytes per instruction; queries are contiguous in the buffer, as in the
        // accumulator's rows of dS^T.
        const uint32_t first_row = score_gradient_row + ticket_parity * Config::kScoreGradientBufferBytes;
        Tensor source = score_gradient_copy.retile_S(make_tensor(tdS.data(), tdP.layout()));  // ((8, 4), 1, 1)
        CUTE_UNROLL
        for (int j = 0; j < size<0, 1>(source); ++j) {
          Tensor values = recast<uint32_t>(source(make_coord(_, j), 0, 0));
          store_matrices_x4(first_row ^ (j * Config::kScoreGradientStoreStep), values(0), values(1), values(2),
                            values(3));
        }
        cutlass::arch::fence_view_async_shared();
      }
      if constexpr (kFused) {
        // Both warpgroups' rows of dS are in place (and, by the same barrier a tile ago, both are done reading this
        // buffer's previous contents). dQ's GEMM goes before dK's, so its block is handed over while dK's runs.
        cutlass::arch::NamedBarrier::sync(Config::kConsumerThreads, 0);
        warpgroup_gemm<true, -1>(get<0>(fused_queries), get<1>(fused_queries)(_, _, _, ticket_parity),
                                 get<2>(fused_queries)(_, _, _, 0), get<3>(fused_queries));
      }
      warpgroup_gemm<false, -1>(mma_gradient, tdS, tSat(_, _, _, stage), tGradA);  // dK += dS^T Q, or dQ += dS K
    }
    if constexpr (kFused) {
      warpgroup_wait<1>();  // dV's and dQ's GEMMs retired; dK's runs on
      warpgroup_fence_operand(get<3>(fused_queries));
      // The stage's query head is head * group + its offset (sum_block is linear in the head and the tile).
      const int block = read_published(&smem.head_offsets[stage]) * sum_tiles + ticket.tile();
      hand_over_query_gradient(get<3>(fused_queries), first_sum_target + int64_t(block) * kSumBlockFloats);
      ticket_parity ^= 1;
    }
    const int this_stage = stage;
    if (++stage == Config::kStages) {
      stage = 0;
      phase ^= 1;
    }
    const TileTicket next = ticket.last() ? TileTicket::none() : wait_for_ticket();
    if (kPipelined && !next.is_none()) {
      issue_scores(stage);
      warpgroup_wait<kScoreGemms>();  // this tile's gradient GEMMs retired; the next scores may still run
    } else {
      warpgroup_wait<0>();
    }
    Barrier::arrive(&smem.empty[this_stage]);
    ticket = next;
  }
  // The loop leaves only after a full wait, but ptxas cannot tell that path from the pipelined one and would inject
  // a wait of its own (warning C7517) before the stores below; this one costs the same and says so.
  warpgroup_wait<0>();
  if constexpr (kFused) hand_over_query_gradient(get<3>(fused_queries), -1);
  if constexpr (kGradientA) warpgroup_fence_operand(tGradA);
  if constexpr (kGradientB) warpgroup_fence_operand(tGradB);

  // Gradient rows: keys [batch, seqlen_k, heads_kv, head_dim] or queries [batch, seqlen_q, heads_q, head_dim].
  const int heads = kKeyMajor ? p.heads_q / p.group : p.heads_q;
  auto row_pointer = [&](void* base) {
    return [=](int row) {
      return static_cast<Element*>(base) +
             ((int64_t(batch) * resident_rows + resident_begin + row) * heads + head) * p.head_dim;
    };
  };
  Tensor out_coords = thread_gradient.partition_C(make_identity_tensor(Shape<Int<kResident>, Int<kHeadDim>>{}));
  const float scale = p.scale;
  if constexpr (kGradientA) {
    store_accumulator<Element>(tGradA, out_coords, resident_rows - resident_begin, p.head_dim,
                               row_pointer(p.grad_a), [=](int) { return scale; });
  }
  if constexpr (kGradientB) {
    store_accumulator<Element>(tGradB, out_coords, resident_rows - resident_begin, p.head_dim,
                               row_pointer(p.grad_b), [](int) { return 1.f; });
  }
}

// kCapped: the call has a soft cap (p.mask.softcap > 0). It is a template parameter, not a runtime test, because
// the consumers' wait depths differ with it, and ptxas keeps the wgmma asynchronous only when every wait and every
// GEMM issue lies on one path.
template <BackwardRole kRole, bool kCapped, class Config>
__global__ void __launch_bounds__(Config::kThreads, 1)
    backward_kernel(CUTE_GRID_CONSTANT const BackwardKernelParams<Config> p) {
  constexpr bool kKeyMajor = kKeyMajorRole<kRole>;
  extern __shared__ char smem_bytes[];
  auto& smem = *reinterpret_cast<typename Config::SharedStorage*>(smem_bytes);
  const int resident_block = blockIdx.x;
  const int head = blockIdx.y, batch = blockIdx.z;  // a KV head when key-major
  if (threadIdx.x == 0) {
    cutlass::arch::ClusterBarrier::init(&smem.resident_full, 1);
    for (int s = 0; s < Config::kStages; ++s) {
      cutlass::arch::ClusterBarrier::init(&smem.full[s], 1);
      cutlass::arch::ClusterBarrier::init(&smem.empty[s], Config::kConsumerThreads);
    }
    if constexpr (kRole == BackwardRole::kFused) {
      cutlass::arch::ClusterBarrier::init(&smem.query_gradient_full, Config::kConsumerThreads);
      cutlass::arch::ClusterBarrier::init(&smem.query_gradient_empty, 1);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  if (threadIdx.x / 128 == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Config::kProducerRegisters>();
    if (threadIdx.x < 32) produce_backward<kKeyMajor, Config>(p, smem, resident_block, head, batch);
    if constexpr (kRole == BackwardRole::kFused) {
      if (threadIdx.x == 32) add_query_gradient_tiles(smem, p.query_gradient_sum);
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<Config::kConsumerRegisters>();
    consume_backward<kRole, kCapped, Config>(p, smem, resident_block, head, batch, threadIdx.x - 128);
  }
}

}  // namespace jax_flash::cuda_kernels::hopper
