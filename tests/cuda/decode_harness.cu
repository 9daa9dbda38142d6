// Standalone GPU check of the decode kernels (no JAX): correctness of out and lse against a double-precision host
// reference (fp16, bf16 and float32; contiguous and paged caches; ragged lengths with NaN poison past each length, so
// any read past a sequence's end shows; GQA/MQA/MHA; q_len up to 16; window; softcap; head dims 64 to 256; one split
// and many), then the GB/s of the issue-6 benchmark cases beside the measured cudnn numbers.
// Build and run from the repo root:
//   nvcc -std=c++17 -O3 -arch=sm_90a --expt-relaxed-constexpr -I csrc tests/cuda/decode_harness.cu \
//        csrc/cuda/decode_split.cu csrc/cuda/decode_kv_update.cu -o /tmp/decode_harness && /tmp/decode_harness
// `--check-only` skips the timing (e.g. under compute-sanitizer --tool memcheck).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "dtype_values.h"

#include "cuda/decode_cuda.h"

using namespace jax_flash;

struct Case { DType dtype; int b, max_len, q_len, hq, hkv, d, page_size; int64_t window; float softcap; };

using harness::load;
using harness::name;
using harness::store;

static double run_case(const Case& c, bool timing, std::mt19937& gen) {
  std::normal_distribution<float> normal;
  const size_t es = harness::element_size(c.dtype);
  const int pages_per_seq = c.page_size ? (c.max_len + c.page_size - 1) / c.page_size : 1;
  const int page_size = c.page_size ? c.page_size : c.max_len;
  const int num_pages = c.page_size ? c.b * pages_per_seq + 2 : c.b;
  std::vector<int32_t> table(c.b * pages_per_seq), lengths(c.b);
  std::vector<int> order(num_pages);
  for (int i = 0; i < num_pages; ++i) order[i] = i;
  if (c.page_size) std::shuffle(order.begin(), order.end(), gen);
  for (int i = 0; i < c.b * pages_per_seq; ++i) table[i] = order[i];
  for (int i = 0; i < c.b; ++i)
    lengths[i] = timing ? c.max_len : i == 0 ? 0 : i == 1 ? c.max_len : i == 2 ? c.q_len / 2 : gen() % (c.max_len + 1);
  const size_t q_n = size_t(c.b) * c.q_len * c.hq * c.d, kv_n = size_t(num_pages) * page_size * c.hkv * c.d;
  std::vector<char> qh(q_n * es), kh(kv_n * es), vh(kv_n * es);
  // Every cache slot starts as NaN; only positions below a sequence's length get values.
  for (size_t i = 0; i < kv_n; ++i) store(c.dtype, timing ? 0.5f : NAN, kh.data(), i), store(c.dtype, timing ? 0.5f : NAN, vh.data(), i);
  for (size_t i = 0; i < q_n; ++i) store(c.dtype, timing ? 0.5f : normal(gen), qh.data(), i);
  auto slot = [&](int b, int j, int h) {
    return ((size_t(table[b * pages_per_seq + j / page_size]) * page_size + j % page_size) * c.hkv + h) * c.d;
  };
  if (!timing)
    for (int b = 0; b < c.b; ++b) for (int j = 0; j < lengths[b]; ++j) for (int h = 0; h < c.hkv; ++h)
      for (int x = 0; x < c.d; ++x) store(c.dtype, normal(gen), kh.data(), slot(b, j, h) + x), store(c.dtype, normal(gen), vh.data(), slot(b, j, h) + x);
  void *dq, *dk, *dv, *dout; int32_t *dlen, *dtable; float* dlse;
  CHECK(cudaMalloc(&dq, q_n * es)); CHECK(cudaMalloc(&dk, kv_n * es)); CHECK(cudaMalloc(&dv, kv_n * es));
  CHECK(cudaMalloc(&dout, q_n * es)); CHECK(cudaMalloc(&dlse, q_n / c.d * 4));
  CHECK(cudaMalloc(&dlen, c.b * 4)); CHECK(cudaMalloc(&dtable, table.size() * 4));
  CHECK(cudaMemcpy(dq, qh.data(), q_n * es, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dk, kh.data(), kv_n * es, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dv, vh.data(), kv_n * es, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dlen, lengths.data(), c.b * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dtable, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
  DecodeParams p{};
  p.dtype = c.dtype; p.batch = c.b; p.q_len = c.q_len; p.heads_q = c.hq;
  p.cache = PagedCache{num_pages, page_size, pages_per_seq, c.hkv, c.d, dtable};
  p.mask = AttentionMask{c.window, 0, c.softcap}; p.scale = 1.f / std::sqrt(float(c.d));
  p.q = dq; p.k = dk; p.v = dv; p.lengths = dlen; p.out = dout; p.lse = dlse;
  DecodePlan plan{};
  CHECK(plan_decode(p, &plan));
  void* workspace = nullptr;
  if (plan.workspace_bytes) CHECK(cudaMalloc(&workspace, plan.workspace_bytes));
  CHECK(launch_decode(p, plan, workspace, 0));
  CHECK(cudaDeviceSynchronize());
  double result = 0;
  if (timing) {
    cudaEvent_t start, stop; cudaEventCreate(&start); cudaEventCreate(&stop);
    const int reps = 50;
    cudaEventRecord(start);
    for (int i = 0; i < reps; ++i) CHECK(launch_decode(p, plan, workspace, 0));
    cudaEventRecord(stop); CHECK(cudaEventSynchronize(stop));
    float ms; cudaEventElapsedTime(&ms, start, stop);
    const double us = ms * 1e3 / reps, bytes = 2.0 * c.b * c.max_len * c.hkv * c.d * es;
    result = bytes / us / 1e3;
    printf("%-5s B=%4d L=%7d page=%3d splits=%3lld  %9.1f us  %7.1f GB/s", name(c.dtype), c.b, c.max_len, c.page_size,
           (long long)plan.splits, us, result);
  } else {
    std::vector<char> out(q_n * es);
    std::vector<float> lse(q_n / c.d);
    CHECK(cudaMemcpy(out.data(), dout, q_n * es, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(lse.data(), dlse, lse.size() * 4, cudaMemcpyDeviceToHost));
    const int group = c.hq / c.hkv;
    double max_err = 0, lse_err = 0;
    for (int b = 0; b < c.b; ++b) for (int i = 0; i < c.q_len; ++i) for (int h = 0; h < c.hq; ++h) {
      const int pos = lengths[b] - c.q_len + i;
      const size_t q_off = ((size_t(b) * c.q_len + i) * c.hq + h) * c.d;
      std::vector<double> logits, acc(c.d, 0.0);
      double mx = -INFINITY;
      for (int j = 0; j <= pos; ++j) {
        if (c.window >= 0 && j < pos - c.window) { logits.push_back(-INFINITY); continue; }
        double s = 0;
        for (int x = 0; x < c.d; ++x) s += double(load(c.dtype, qh.data(), q_off + x)) * load(c.dtype, kh.data(), slot(b, j, h / group) + x);
        s *= p.scale;
        if (c.softcap > 0) s = c.softcap * std::tanh(s / c.softcap);
        logits.push_back(s); mx = std::max(mx, s);
      }
      double sum = 0;
      for (int j = 0; j < int(logits.size()); ++j) {
        if (logits[j] == -INFINITY) continue;
        const double w = std::exp(logits[j] - mx); sum += w;
        for (int x = 0; x < c.d; ++x) acc[x] += w * load(c.dtype, vh.data(), slot(b, j, h / group) + x);
      }
      for (int x = 0; x < c.d; ++x) {
        const double expected = sum > 0 ? acc[x] / sum : 0.0, got = load(c.dtype, out.data(), q_off + x);
        max_err = std::isnan(got) ? INFINITY : std::max(max_err, std::fabs(got - expected));
      }
      const double expected_lse = sum > 0 ? mx + std::log(sum) : -INFINITY;
      const double got_lse = lse[(size_t(b) * c.hq + h) * c.q_len + i];
      if (expected_lse == -INFINITY) lse_err = std::max(lse_err, got_lse == -INFINITY ? 0.0 : INFINITY);
      else lse_err = std::max(lse_err, std::isnan(got_lse) ? INFINITY : std::fabs(got_lse - expected_lse));
    }
    const double tolerance = c.dtype == DType::kFloat32 ? 1e-4 : c.dtype == DType::kFloat16 ? 4e-3 : 2e-2;
    const bool ok = max_err < tolerance && lse_err < 1e-3;
    printf("%-5s B=%d L=%d q_len=%d %d/%d D=%d page=%d window=%lld softcap=%g splits=%lld: out err %.2e, lse err %.2e %s\n",
           name(c.dtype), c.b, c.max_len, c.q_len, c.hq, c.hkv, c.d, c.page_size, (long long)c.window, c.softcap,
           (long long)plan.splits, max_err, lse_err, ok ? "ok" : "FAIL");
    result = ok ? 0.0 : 1.0;
  }
  for (void* x : {dq, dk, dv, dout, (void*)dlse, (void*)dlen, (void*)dtable, workspace}) cudaFree(x);
  return result;
}

int main(int argc, char** argv) {
  const bool check_only = argc > 1 && std::strcmp(argv[1], "--check-only") == 0;
  std::mt19937 gen(0);
  const DType bf16 = DType::kBFloat16, f16 = DType::kFloat16, f32 = DType::kFloat32;
  const Case checks[] = {
      {bf16, 4, 77, 1, 8, 8, 128, 0, -1, 0},       {bf16, 4, 77, 1, 32, 8, 128, 0, -1, 0},
      {bf16, 3, 96, 1, 8, 1, 256, 16, -1, 0},      {bf16, 4, 4099, 1, 32, 8, 128, 0, -1, 0},
      {bf16, 2, 4096, 1, 32, 8, 128, 64, -1, 0},   {bf16, 4, 61, 16, 4, 1, 64, 0, -1, 0},
      {bf16, 4, 93, 4, 8, 2, 80, 0, 9, 0},         {bf16, 4, 66, 3, 4, 1, 96, 0, -1, 2.5f},
      {bf16, 5, 128, 2, 64, 8, 128, 32, 40, 5.f},  {bf16, 1, 20000, 1, 32, 8, 128, 0, -1, 0},
      {bf16, 1, 9000, 2, 16, 2, 256, 48, 3000, 0}, {bf16, 3, 700, 16, 64, 8, 128, 16, -1, 0},
      {bf16, 2, 5000, 1, 8, 8, 64, 128, 100, 0},   {bf16, 4, 300, 5, 12, 4, 72, 0, -1, 0},
      {f16, 4, 77, 1, 32, 8, 128, 0, -1, 0},       {f16, 3, 96, 1, 8, 1, 256, 16, -1, 0},
      {f16, 4, 93, 4, 8, 2, 64, 0, 9, 0},          {f16, 5, 128, 2, 64, 8, 128, 32, 40, 5.f},
      {f16, 1, 30000, 1, 32, 8, 128, 256, -1, 0},  {f16, 2, 3000, 16, 16, 1, 256, 0, 500, 30.f},
      {f32, 4, 77, 1, 32, 8, 128, 0, -1, 0},       {f32, 3, 96, 1, 8, 1, 256, 16, -1, 0},
      {f32, 4, 61, 16, 4, 1, 64, 0, -1, 0},        {f32, 5, 128, 2, 64, 8, 128, 32, 40, 5.f},
      {f32, 1, 20000, 1, 32, 8, 32, 0, -1, 0}};
  int failures = 0;
  for (const Case& c : checks) failures += run_case(c, false, gen) != 0.0;
  if (!check_only) {
    struct Bench { Case c; double cudnn_us; };
    const Bench bench[] = {{{bf16, 8, 4096, 1, 32, 8, 128, 0, -1, 0}, 53},
                           {{bf16, 8, 32768, 1, 32, 8, 128, 0, -1, 0}, 272},
                           {{bf16, 1, 131072, 1, 32, 8, 128, 0, -1, 0}, 147},
                           {{bf16, 64, 8192, 1, 32, 8, 128, 0, -1, 0}, 504},
                           {{bf16, 128, 2048, 1, 32, 8, 128, 0, -1, 0}, 268},
                           {{bf16, 8, 32768, 1, 32, 8, 128, 16, -1, 0}, 0}};
    printf("\nGQA 32/8, D=128, one query token; GB/s = K+V bytes / time (cudnn: jax.nn measured on H200 before)\n");
    for (const Bench& b : bench) {
      run_case(b.c, true, gen);
      const double bytes = 2.0 * b.c.b * b.c.max_len * b.c.hkv * b.c.d * 2;
      if (b.cudnn_us > 0) printf("   cudnn %7.1f us  %7.1f GB/s\n", b.cudnn_us, bytes / b.cudnn_us / 1e3);
      else printf("   (paged, page 16)\n");
    }
  }
  printf(failures ? "%d CHECKS FAILED\n" : "ALL OK\n", failures);
  return failures ? 1 : 0;
}
