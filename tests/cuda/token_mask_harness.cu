// Standalone GPU check of the CUDA attention kernels under a TokenMask (lengths, segment ids, positions), no JAX:
// out, lse, dq, dk and dv against a double-precision host reference built on token_visible (attention_mask.h), for
// the tensor-core kernels (fp16, bf16) and the simple ones (float32). Layouts are random: 1 to 20 documents per row,
// then padding (a segment of its own), rows long enough that the tile walk classifies several windows of 32 tiles.
// Checks: errors within the dtype's tolerance, rows that see no key give 0 and lse -inf, keys no query sees get 0
// gradients, nothing is NaN, and a TokenMask whose every pair is visible gives bitwise the dense kernels' results.
// With --time, the forward and forward+backward of 8 packed documents at S=16k, against dense causal attention, in
// TFLOP/s of visible work (issue 7's target: at least 90% of dense causal).
// Build and run from the repo root (head dims 64 and 128 only, to keep the build short):
//   nvcc -std=c++17 -O3 -arch=sm_90a --expt-relaxed-constexpr -I csrc -DJAX_FLASH_HEAD_DIM_64 \
//        -DJAX_FLASH_HEAD_DIM_128 -DJAX_FLASH_DTYPE_FP16 -DJAX_FLASH_DTYPE_BF16 tests/cuda/token_mask_harness.cu \
//        csrc/cuda/attention_forward_simple.cu csrc/cuda/attention_backward_simple.cu csrc/cuda/backward_delta.cu \
//        csrc/cuda/token_chunks.cu \
//        csrc/cuda/tensor_core/generated/dispatch.cu csrc/cuda/tensor_core/generated/attention_*_hdim{64,128}.cu \
//        -o /tmp/token_mask_harness && /tmp/token_mask_harness --time
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "dtype_values.h"

#include "attention_mask.h"
#include "cuda/attention_simple.h"
#include "cuda/backward_delta.h"
#include "cuda/tensor_core/tensor_core.h"
#include "cuda/token_chunks.h"

using namespace jax_flash;

struct Case {
  DType dtype;
  int batch, seq_q, seq_k, heads_q, heads_kv, head_dim;
  bool segments, positions, lengths;
  int64_t window_left, window_right;
  float softcap;
};

using harness::element_size;
using harness::load;
using harness::name;
using harness::store;

// A tensor on host and device, stored as the dtype; `host` holds the values the device sees, as doubles.
struct Tensor {
  DType dtype;
  std::vector<char> bytes;
  std::vector<double> host;
  void* device = nullptr;
  Tensor(DType t, size_t n) : dtype(t), bytes(n * element_size(t)), host(n) {
    CHECK(cudaMalloc(&device, bytes.size()));
  }
  ~Tensor() { cudaFree(device); }
  void fill(std::mt19937& gen) {
    std::normal_distribution<float> normal;
    for (size_t i = 0; i < host.size(); ++i) {
      store(dtype, normal(gen), bytes.data(), i);
      host[i] = load(dtype, bytes.data(), i);
    }
    CHECK(cudaMemcpy(device, bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
  }
  std::vector<double> fetch() {
    CHECK(cudaMemcpy(bytes.data(), device, bytes.size(), cudaMemcpyDeviceToHost));
    std::vector<double> out(host.size());
    for (size_t i = 0; i < out.size(); ++i) out[i] = load(dtype, bytes.data(), i);
    return out;
  }
};

// An int32 array on host and device; assigning a new one frees the old device copy.
struct IntArray {
  std::vector<int32_t> host;
  int32_t* device = nullptr;
  explicit IntArray(std::vector<int32_t> values) : host(std::move(values)) {
    CHECK(cudaMalloc(&device, std::max<size_t>(4, host.size() * 4)));
    CHECK(cudaMemcpy(device, host.data(), host.size() * 4, cudaMemcpyHostToDevice));
  }
  IntArray& operator=(IntArray&& other) {
    std::swap(host, other.host), std::swap(device, other.device);
    return *this;
  }
  IntArray(const IntArray&) = delete;
  ~IntArray() { cudaFree(device); }
};

// Segment ids and in-document positions of `batch` rows of `seq` tokens: documents of random lengths, then padding
// (id -1); `used` gets each row's token count before the padding. With `documents` > 0, exactly that many per row.
static void random_layout(std::mt19937& gen, int batch, int seq, int documents, std::vector<int32_t>& ids,
                          std::vector<int32_t>& positions, std::vector<int32_t>& used) {
  ids.assign(size_t(batch) * seq, -1), positions.assign(size_t(batch) * seq, 0), used.assign(batch, 0);
  for (int b = 0; b < batch; ++b) {
    used[b] = documents ? seq : 1 + int(gen() % seq);
    const int docs = documents ? documents : 1 + int(gen() % std::min(20, used[b]));
    std::vector<int> cuts{0, used[b]};
    while (int(cuts.size()) < docs + 1) {
      const int cut = 1 + int(gen() % std::max(1, used[b] - 1));
      if (std::find(cuts.begin(), cuts.end(), cut) == cuts.end() && cut < used[b]) cuts.push_back(cut);
    }
    std::sort(cuts.begin(), cuts.end());
    const int first_id = int(gen() % 1000);
    for (int d = 0; d + 1 < int(cuts.size()); ++d)
      for (int i = cuts[d]; i < cuts[d + 1]; ++i)
        ids[size_t(b) * seq + i] = first_id + 3 * d, positions[size_t(b) * seq + i] = i - cuts[d];
  }
}

// Forward and backward of one case on the device: the kernels launch.cu would pick for the dtype.
struct Results {
  std::vector<double> out, lse, dq, dk, dv;
};

static Results run_kernels(const Case& c, const AttentionShape& shape, const AttentionMask& mask,
                           const TokenMask& tokens, Tensor& q, Tensor& k, Tensor& v, Tensor& dout, void* workspace,
                           int repeats = 1, float* forward_ms = nullptr, float* total_ms = nullptr) {
  Tensor out(c.dtype, q.host.size()), dq(c.dtype, q.host.size());
  Tensor dk(c.dtype, k.host.size()), dv(c.dtype, v.host.size());
  float* lse;
  const size_t lse_n = size_t(shape.batch) * shape.heads_q * shape.seqlen_q;
  CHECK(cudaMalloc(&lse, lse_n * 4));
  const float scale = 1.f / std::sqrt(float(c.head_dim));
  // The chunk summaries launch.cu computes per call; once here, outside the timed region.
  TokenMask summarized = tokens;
  void* chunks = nullptr;
  CHECK(cudaMalloc(&chunks, std::max<size_t>(16, cuda_kernels::token_chunks_bytes(shape, tokens))));
  CHECK(cuda_kernels::summarize_token_chunks(shape, &summarized, chunks, nullptr));
  AttentionForwardParams f{c.dtype, shape, mask, scale, q.device, k.device, v.device, out.device, lse, summarized};
  AttentionBackwardParams b{c.dtype, shape, mask, scale, dout.device, q.device, k.device, v.device, out.device,
                            lse, dq.device, dk.device, dv.device, summarized};
  const auto forward = [&] {
    return c.dtype == DType::kFloat32 ? cuda_kernels::attention_forward_simple(f, nullptr)
                                      : cuda_kernels::tensor_core::forward(f, nullptr);
  };
  const auto backward = [&] {
    return c.dtype == DType::kFloat32 ? cuda_kernels::attention_backward_simple(b, workspace, nullptr)
                                      : cuda_kernels::tensor_core::backward(b, workspace, nullptr);
  };
  cudaEvent_t start, middle, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&middle));
  CHECK(cudaEventCreate(&stop));
  for (int warmup = 0; warmup < (repeats > 1 ? 2 : 0); ++warmup) {
    CHECK(forward());
    CHECK(backward());
  }
  CHECK(cudaEventRecord(start));
  for (int r = 0; r < repeats; ++r) CHECK(forward());
  CHECK(cudaEventRecord(middle));
  for (int r = 0; r < repeats; ++r) CHECK(backward());
  CHECK(cudaEventRecord(stop));
  CHECK(cudaDeviceSynchronize());
  float fwd = 0, bwd = 0;
  CHECK(cudaEventElapsedTime(&fwd, start, middle));
  CHECK(cudaEventElapsedTime(&bwd, middle, stop));
  if (forward_ms) *forward_ms = fwd / repeats;
  if (total_ms) *total_ms = (fwd + bwd) / repeats;
  Results r{out.fetch(), std::vector<double>(lse_n), dq.fetch(), dk.fetch(), dv.fetch()};
  std::vector<float> lse_host(lse_n);
  CHECK(cudaMemcpy(lse_host.data(), lse, lse_n * 4, cudaMemcpyDeviceToHost));
  std::copy(lse_host.begin(), lse_host.end(), r.lse.begin());
  cudaFree(lse);
  cudaFree(chunks);
  cudaEventDestroy(start), cudaEventDestroy(middle), cudaEventDestroy(stop);
  return r;
}

// The reference: softmax over the keys token_visible lets each query see, in double, and its gradients. `seen`
// marks the keys some query sees.
static Results reference(const Case& c, const AttentionShape& sh, const AttentionMask& mask, const TokenMask& tokens,
                         const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                         std::vector<char>& seen) {
  const int D = c.head_dim, group = c.heads_q / c.heads_kv;
  const double scale = 1.0 / std::sqrt(double(D));
  Results r{std::vector<double>(q.host.size()), std::vector<double>(size_t(sh.batch) * sh.heads_q * sh.seqlen_q),
            std::vector<double>(q.host.size()), std::vector<double>(k.host.size()), std::vector<double>(v.host.size())};
  seen.assign(size_t(sh.batch) * sh.seqlen_k, 0);
  std::vector<double> capped(sh.seqlen_k), p(sh.seqlen_k), dp(sh.seqlen_k);
  const auto qi = [&](int b, int i, int h) { return ((size_t(b) * sh.seqlen_q + i) * sh.heads_q + h) * D; };
  const auto kj = [&](int b, int j, int h) { return ((size_t(b) * sh.seqlen_k + j) * sh.heads_kv + h) * D; };
  for (int b = 0; b < sh.batch; ++b)
    for (int h = 0; h < sh.heads_q; ++h)
      for (int i = 0; i < sh.seqlen_q; ++i) {
        const size_t stat = (size_t(b) * sh.heads_q + h) * sh.seqlen_q + i, row = qi(b, i, h);
        double row_max = -INFINITY;
        for (int j = 0; j < sh.seqlen_k; ++j) {
          capped[j] = -INFINITY;
          if (!token_visible(mask, tokens, sh, b, i, j)) continue;
          seen[size_t(b) * sh.seqlen_k + j] = 1;
          double s = 0;
          for (int d = 0; d < D; ++d) s += q.host[row + d] * k.host[kj(b, j, h / group) + d];
          capped[j] = c.softcap > 0 ? c.softcap * std::tanh(s * scale / c.softcap) : s * scale;
          row_max = std::max(row_max, capped[j]);
        }
        r.lse[stat] = -INFINITY;
        if (row_max == -INFINITY) continue;
        double sum = 0;
        for (int j = 0; j < sh.seqlen_k; ++j) sum += std::exp(capped[j] - row_max);
        r.lse[stat] = row_max + std::log(sum);
        double delta = 0;
        for (int j = 0; j < sh.seqlen_k; ++j) {
          p[j] = std::exp(capped[j] - r.lse[stat]);
          dp[j] = 0;
          if (p[j] == 0) continue;
          const size_t key = kj(b, j, h / group);
          for (int d = 0; d < D; ++d) {
            r.out[row + d] += p[j] * v.host[key + d];
            dp[j] += dout.host[row + d] * v.host[key + d];
          }
          delta += p[j] * dp[j];
        }
        for (int j = 0; j < sh.seqlen_k; ++j) {
          if (p[j] == 0) continue;
          const double t = c.softcap > 0 ? capped[j] / c.softcap : 0;
          const double ds = p[j] * (dp[j] - delta) * (1 - t * t) * scale;
          const size_t key = kj(b, j, h / group);
          for (int d = 0; d < D; ++d) {
            r.dq[row + d] += ds * k.host[key + d];
            r.dk[key + d] += ds * q.host[row + d];
            r.dv[key + d] += p[j] * dout.host[row + d];
          }
        }
      }
  return r;
}

// Largest |got - want| over the largest |want| (1 when want is all 0), and whether got is finite everywhere.
static double relative_error(const std::vector<double>& got, const std::vector<double>& want, bool* finite) {
  double error = 0, scale = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) *finite = false;
    error = std::max(error, std::abs(got[i] - want[i])), scale = std::max(scale, std::abs(want[i]));
  }
  return error / (scale > 0 ? scale : 1);
}

struct Problem {
  Case c;
  AttentionShape shape;
  AttentionMask mask;
  Tensor q, k, v, dout;
  IntArray q_lengths, kv_lengths, q_ids, kv_ids, q_positions, kv_positions;
  void* workspace = nullptr;

  Problem(const Case& cs, std::mt19937& gen, int documents)
      : c(cs),
        shape{cs.batch, cs.seq_q, cs.seq_k, cs.heads_q, cs.heads_kv, cs.head_dim},
        mask{cs.window_left, cs.window_right, cs.softcap},
        q(cs.dtype, size_t(cs.batch) * cs.seq_q * cs.heads_q * cs.head_dim),
        k(cs.dtype, size_t(cs.batch) * cs.seq_k * cs.heads_kv * cs.head_dim),
        v(cs.dtype, k.host.size()),
        dout(cs.dtype, q.host.size()),
        q_lengths({}), kv_lengths({}), q_ids({}), kv_ids({}), q_positions({}), kv_positions({}) {
    q.fill(gen), k.fill(gen), v.fill(gen), dout.fill(gen);
    std::vector<int32_t> ids_q, pos_q, used_q, ids_k, pos_k, used_k;
    random_layout(gen, cs.batch, cs.seq_q, documents, ids_q, pos_q, used_q);
    if (cs.seq_q == cs.seq_k) ids_k = ids_q, pos_k = pos_q, used_k = used_q;
    else random_layout(gen, cs.batch, cs.seq_k, documents, ids_k, pos_k, used_k);
    used_q[0] = 0;  // a row with no live query
    if (cs.batch > 1) used_k[1] = cs.seq_k + 5;  // a length past the sequence keeps it whole
    q_lengths = IntArray(used_q), kv_lengths = IntArray(used_k), q_ids = IntArray(ids_q), kv_ids = IntArray(ids_k);
    q_positions = IntArray(pos_q), kv_positions = IntArray(pos_k);
    CHECK(cudaMalloc(&workspace, std::max<size_t>(16, cuda_kernels::backward_delta_bytes(shape))));
  }
  ~Problem() { cudaFree(workspace); }

  // The TokenMask of the case, with device (or host) pointers.
  TokenMask tokens(bool on_device) const {
    const auto pick = [&](const IntArray& a, bool present) -> const int32_t* {
      return present ? (on_device ? a.device : a.host.data()) : nullptr;
    };
    return TokenMask{pick(q_lengths, c.lengths), pick(kv_lengths, c.lengths), pick(q_ids, c.segments),
                     pick(kv_ids, c.segments), pick(q_positions, c.positions), pick(kv_positions, c.positions)};
  }
};

static bool check_case(const Case& c, std::mt19937& gen) {
  Problem problem(c, gen, 0);
  const Results got = run_kernels(c, problem.shape, problem.mask, problem.tokens(true), problem.q, problem.k,
                                  problem.v, problem.dout, problem.workspace);
  std::vector<char> seen;
  const Results want = reference(c, problem.shape, problem.mask, problem.tokens(false), problem.q, problem.k,
                                 problem.v, problem.dout, seen);
  bool finite = true, exact = true;
  const double tolerance = c.dtype == DType::kFloat32 ? 1e-4 : c.dtype == DType::kFloat16 ? 1e-2 : 4e-2;
  const double errors[] = {relative_error(got.out, want.out, &finite), relative_error(got.dq, want.dq, &finite),
                           relative_error(got.dk, want.dk, &finite), relative_error(got.dv, want.dv, &finite)};
  double lse_error = 0;
  for (size_t i = 0; i < got.lse.size(); ++i) {
    if (want.lse[i] == -INFINITY) {
      exact = exact && got.lse[i] == -INFINITY;
      for (int d = 0; d < c.head_dim; ++d) {
        const size_t b = i / (c.heads_q * c.seq_q), h = i / c.seq_q % c.heads_q, row = i % c.seq_q;
        const size_t at = ((b * c.seq_q + row) * c.heads_q + h) * c.head_dim + d;
        exact = exact && got.out[at] == 0 && got.dq[at] == 0;
      }
    } else {
      lse_error = std::max(lse_error, std::abs(got.lse[i] - want.lse[i]));
    }
  }
  for (size_t j = 0; j < seen.size(); ++j)
    for (int h = 0; h < c.heads_kv && !seen[j]; ++h)
      for (int d = 0; d < c.head_dim; ++d) {
        const size_t at = (j * c.heads_kv + h) * c.head_dim + d;
        exact = exact && got.dk[at] == 0 && got.dv[at] == 0;
      }
  const bool ok = finite && exact && lse_error < tolerance / 4 &&
                  std::all_of(std::begin(errors), std::end(errors), [&](double e) { return e < tolerance; });
  printf("%-4s %s b%d q%d k%d h%d/%d d%d seg%d pos%d len%d win(%lld,%lld) cap%g: out %.1e dq %.1e dk %.1e dv %.1e "
         "lse %.1e%s%s\n",
         ok ? "ok" : "FAIL", name(c.dtype), c.batch, c.seq_q, c.seq_k, c.heads_q, c.heads_kv, c.head_dim, c.segments,
         c.positions, c.lengths, (long long)c.window_left, (long long)c.window_right, c.softcap, errors[0], errors[1],
         errors[2], errors[3], lse_error, finite ? "" : " NON-FINITE", exact ? "" : " blind rows/unseen keys not 0");
  return ok;
}

// A TokenMask whose every pair is visible (one segment, full lengths) walks the same tiles as the dense kernels,
// every one of them full or masked the same way, so the results must be bitwise equal.
static bool check_all_visible_matches_dense(DType dtype, std::mt19937& gen) {
  const Case c{dtype, 2, 333, 517, 4, 2, 128, true, false, true, -1, 0, 0.f};
  Problem problem(c, gen, 1);
  std::vector<int32_t> zeros_q(size_t(c.batch) * c.seq_q, 7), zeros_k(size_t(c.batch) * c.seq_k, 7);
  problem.q_ids = IntArray(zeros_q), problem.kv_ids = IntArray(zeros_k);
  problem.q_lengths = IntArray(std::vector<int32_t>(c.batch, c.seq_q));
  problem.kv_lengths = IntArray(std::vector<int32_t>(c.batch, c.seq_k + 3));
  const Results masked = run_kernels(c, problem.shape, problem.mask, problem.tokens(true), problem.q, problem.k,
                                     problem.v, problem.dout, problem.workspace);
  const Results dense = run_kernels(c, problem.shape, problem.mask, TokenMask{}, problem.q, problem.k, problem.v,
                                    problem.dout, problem.workspace);
  const bool ok = masked.out == dense.out && masked.lse == dense.lse && masked.dq == dense.dq &&
                  masked.dk == dense.dk && masked.dv == dense.dv;
  printf("%-4s %s all-visible TokenMask is bitwise the dense causal result\n", ok ? "ok" : "FAIL", name(dtype));
  return ok;
}

// 8 documents per row at S=16k, causal on positions, against dense causal attention on the same tensors; TFLOP/s
// count the visible (query, key) pairs only: 4 * pairs * head_dim * heads forward, 2.5 times that for fwd+bwd.
static void time_packed_rows(DType dtype, int head_dim, std::mt19937& gen) {
  const Case c{dtype, 1, 16384, 16384, 16, 16, head_dim, true, true, false, -1, 0, 0.f};
  Problem problem(c, gen, 8);
  double packed_pairs = 0, causal_pairs = double(c.seq_q) * (c.seq_q + 1) / 2;
  for (int i = 0; i < c.seq_q; ++i) packed_pairs += problem.q_positions.host[i] + 1;
  const double flop_per_pair = 4.0 * head_dim * c.heads_q;
  float packed_fwd, packed_total, dense_fwd, dense_total;
  run_kernels(c, problem.shape, problem.mask, problem.tokens(true), problem.q, problem.k, problem.v, problem.dout,
              problem.workspace, 10, &packed_fwd, &packed_total);
  run_kernels(c, problem.shape, problem.mask, TokenMask{}, problem.q, problem.k, problem.v, problem.dout,
              problem.workspace, 10, &dense_fwd, &dense_total);
  const auto tflops = [](double flop, float ms) { return flop / (ms * 1e-3) / 1e12; };
  const double packed_f = tflops(packed_pairs * flop_per_pair, packed_fwd);
  const double dense_f = tflops(causal_pairs * flop_per_pair, dense_fwd);
  const double packed_t = tflops(2.5 * packed_pairs * flop_per_pair, packed_total);
  const double dense_t = tflops(2.5 * causal_pairs * flop_per_pair, dense_total);
  printf("%s d%d S=16k, 8 packed documents vs dense causal, TFLOP/s of visible work: forward %.1f vs %.1f (%.0f%%), "
         "forward+backward %.1f vs %.1f (%.0f%%)\n",
         name(dtype), head_dim, packed_f, dense_f, 100 * packed_f / dense_f, packed_t, dense_t,
         100 * packed_t / dense_t);
}

int main(int argc, char** argv) {
  std::mt19937 gen(7);
  const Case cases[] = {
      // dtype, batch, seq_q, seq_k, heads, head_dim, segments, positions, lengths, window, softcap
      {DType::kBFloat16, 2, 300, 300, 4, 2, 128, true, false, false, -1, -1, 0.f},
      {DType::kBFloat16, 2, 300, 300, 4, 2, 64, true, false, true, -1, 0, 0.f},
      {DType::kFloat16, 2, 2200, 2200, 2, 1, 128, true, true, true, -1, 0, 0.f},
      {DType::kBFloat16, 1, 2300, 2300, 2, 2, 64, true, true, false, 40, 0, 5.f},
      {DType::kFloat16, 2, 150, 330, 4, 1, 64, true, true, false, -1, 0, 0.f},
      {DType::kBFloat16, 3, 330, 150, 2, 2, 128, false, false, true, 30, 30, 0.f},
      {DType::kFloat16, 2, 700, 700, 4, 4, 128, false, false, true, -1, 0, 20.f},
      {DType::kFloat32, 2, 300, 300, 4, 2, 64, true, true, true, -1, 0, 0.f},
      {DType::kFloat32, 2, 150, 330, 2, 1, 128, true, false, true, 16, 4, 10.f},
  };
  bool ok = true;
  for (const Case& c : cases) ok = check_case(c, gen) && ok;
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) ok = check_all_visible_matches_dense(dtype, gen) && ok;
  if (argc > 1 && std::strcmp(argv[1], "--time") == 0)
    for (int head_dim : {64, 128}) time_packed_rows(DType::kBFloat16, head_dim, gen);
  printf(ok ? "all token-mask checks passed\n" : "SOME TOKEN-MASK CHECKS FAILED\n");
  return ok ? 0 : 1;
}
