// Standalone GPU check and sweep of the decode kernels (no JAX), in one run:
// 1. correctness of out and lse against a double-precision host reference (fp16, bf16 and float32; contiguous and
//    paged caches; ragged lengths with NaN poison past each length, so any read past a sequence's end shows;
//    GQA/MQA/MHA; q_len up to 16; window; softcap; head dims 32 to 256; one split and many), with the production plan;
// 2. the device-copy bandwidth (cudaMemcpyAsync device to device of 1 GiB), against which the targets are set;
// 3. for each block shape of DecodeTuning (rows2, rows3, wide, narrow): the fp16/bf16 cases again, then GB/s of K+V
//    read on the issue-6 benchmark cases (head dim 128, or --head-dim) for each grid order x wave count, one row per
//    variant with a score (the worst ratio to the targets: 2.9 TB/s at B=8 L=4k, 3.85 TB/s at the others, 95% of
//    that for the paged cache; every timed output is checked too), and a row for the production plan (plan_decode),
//    which is also timed at head dims 64 and 256; the three best again with the combine launched as a programmatic
//    dependent ("/pdl"), then with the splits combined in thread-block clusters ("/cluster"; split counts printed
//    "(2c)" where a plan uses them); then the fastest variant per case and, on the last line, the best-scoring
//    variant among the correct ones: what kDefaultDecodeTuning should be.
// Build (needs nvcc, no GPU) and run from the repo root:
//   python tests/cuda/decode_copy_variants.py build /tmp/dh main && /tmp/dh/decode_harness_main
// `--check-only` skips the copy and the sweep (e.g. under compute-sanitizer --tool memcheck); `--head-dim D` sweeps
// the benchmark cases at head dim D instead of 128 (the targets stay those of 128).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
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

// Device buffers and params of one case. Lengths and the page table come from the caller; page ids are a shuffled
// permutation of the pool (two pages more than needed), so neighbouring positions live far apart.
struct DeviceCase {
  DecodeParams p{};
  std::vector<int32_t> table;
  int pages_per_seq, page_size, num_pages;
  size_t q_n, kv_n;
  void *q = nullptr, *k = nullptr, *v = nullptr, *out = nullptr;
  int32_t *lengths = nullptr, *page_table = nullptr;
  float* lse = nullptr;

  DeviceCase(const Case& c, std::mt19937& gen) {
    pages_per_seq = c.page_size ? (c.max_len + c.page_size - 1) / c.page_size : 1;
    page_size = c.page_size ? c.page_size : c.max_len;
    num_pages = c.page_size ? c.b * pages_per_seq + 2 : c.b;
    std::vector<int> order(num_pages);
    for (int i = 0; i < num_pages; ++i) order[i] = i;
    if (c.page_size) std::shuffle(order.begin(), order.end(), gen);
    table.assign(order.begin(), order.begin() + size_t(c.b) * pages_per_seq);
    const size_t es = harness::element_size(c.dtype);
    q_n = size_t(c.b) * c.q_len * c.hq * c.d, kv_n = size_t(num_pages) * page_size * c.hkv * c.d;
    CHECK(cudaMalloc(&q, q_n * es)); CHECK(cudaMalloc(&k, kv_n * es)); CHECK(cudaMalloc(&v, kv_n * es));
    CHECK(cudaMalloc(&out, q_n * es)); CHECK(cudaMalloc(&lse, q_n / c.d * 4));
    CHECK(cudaMalloc(&lengths, c.b * 4)); CHECK(cudaMalloc(&page_table, table.size() * 4));
    CHECK(cudaMemcpy(page_table, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
    p.dtype = c.dtype; p.batch = c.b; p.q_len = c.q_len; p.heads_q = c.hq;
    p.cache = PagedCache{num_pages, page_size, pages_per_seq, c.hkv, c.d, page_table};
    p.mask = AttentionMask{c.window, 0, c.softcap}; p.scale = 1.f / std::sqrt(float(c.d));
    p.q = q; p.k = k; p.v = v; p.lengths = lengths; p.out = out; p.lse = lse;
  }
  ~DeviceCase() { for (void* x : {q, k, v, out, (void*)lse, (void*)lengths, (void*)page_table}) cudaFree(x); }
  size_t slot(int b, int j, int h, const Case& c) const {
    return ((size_t(table[b * pages_per_seq + j / page_size]) * page_size + j % page_size) * c.hkv + h) * c.d;
  }
};

constexpr size_t kNoWorkspaceLimit = SIZE_MAX;  // the harness allocates whatever a plan asks for

// Plans with `tuning` (the production plan_decode when null), runs once and synchronizes; the workspace is the
// caller's to free.
static DecodePlan plan_and_run(const DecodeParams& p, const DecodeTuning* tuning, void** workspace) {
  DecodePlan plan{};
  CHECK(tuning ? plan_decode_tuned(p, *tuning, kNoWorkspaceLimit, &plan)
               : plan_decode(p, kNoWorkspaceLimit, &plan));
  *workspace = nullptr;
  if (plan.workspace_bytes) CHECK(cudaMalloc(workspace, plan.workspace_bytes));
  CHECK(launch_decode(p, plan, *workspace, 0));
  CHECK(cudaDeviceSynchronize());
  return plan;
}

static std::string variant_name(const DecodeTuning& t) {
  return std::string(decode_kernel_name(t.kernel)) + (t.heads_fastest ? "/heads" : "/splits") + "/" +
         std::to_string(t.waves) + "w" + (t.overlap_combine ? "/pdl" : "") + (t.cluster_combine ? "/cluster" : "");
}

// Whether a call with `tuning` plans, launches and completes here (a kernel shape may need more shared memory than
// the GPU has; the "/pdl" launch attribute needs sm_90 and a recent driver); prints the error otherwise. The case's
// caches are zeros.
static bool launches(const Case& c, const DecodeTuning& tuning, std::mt19937& gen) {
  DeviceCase dc(c, gen);
  CHECK(cudaMemset(dc.q, 0, dc.q_n * 2)); CHECK(cudaMemset(dc.k, 0, dc.kv_n * 2)); CHECK(cudaMemset(dc.v, 0, dc.kv_n * 2));
  std::vector<int32_t> lengths(c.b, c.max_len);
  CHECK(cudaMemcpy(dc.lengths, lengths.data(), c.b * 4, cudaMemcpyHostToDevice));
  DecodePlan plan{};
  void* workspace = nullptr;
  cudaError_t status = plan_decode_tuned(dc.p, tuning, kNoWorkspaceLimit, &plan);
  if (status == cudaSuccess && plan.workspace_bytes) CHECK(cudaMalloc(&workspace, plan.workspace_bytes));
  if (status == cudaSuccess) status = launch_decode(dc.p, plan, workspace, 0);
  if (status == cudaSuccess) status = cudaDeviceSynchronize();
  cudaGetLastError();  // refused attributes and launches are not sticky errors
  cudaFree(workspace);
  if (status != cudaSuccess) printf("%s: %s\n", variant_name(tuning).c_str(), cudaGetErrorString(status));
  return status == cudaSuccess;
}

// Checks out and lse of one case against the float64 reference; prints a line when `verbose` or on failure.
static bool check_case(const Case& c, const DecodeTuning* tuning, bool verbose, std::mt19937& gen) {
  std::normal_distribution<float> normal;
  const size_t es = harness::element_size(c.dtype);
  DeviceCase dc(c, gen);
  std::vector<int32_t> lengths(c.b);
  for (int i = 0; i < c.b; ++i)
    lengths[i] = i == 0 ? 0 : i == 1 ? c.max_len : i == 2 ? c.q_len / 2 : gen() % (c.max_len + 1);
  std::vector<char> qh(dc.q_n * es), kh(dc.kv_n * es), vh(dc.kv_n * es);
  // Every cache slot starts as NaN; only positions below a sequence's length get values.
  for (size_t i = 0; i < dc.kv_n; ++i) store(c.dtype, NAN, kh.data(), i), store(c.dtype, NAN, vh.data(), i);
  for (size_t i = 0; i < dc.q_n; ++i) store(c.dtype, normal(gen), qh.data(), i);
  for (int b = 0; b < c.b; ++b) for (int j = 0; j < lengths[b]; ++j) for (int h = 0; h < c.hkv; ++h)
    for (int x = 0; x < c.d; ++x)
      store(c.dtype, normal(gen), kh.data(), dc.slot(b, j, h, c) + x), store(c.dtype, normal(gen), vh.data(), dc.slot(b, j, h, c) + x);
  CHECK(cudaMemcpy(dc.q, qh.data(), dc.q_n * es, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dc.k, kh.data(), dc.kv_n * es, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dc.v, vh.data(), dc.kv_n * es, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dc.lengths, lengths.data(), c.b * 4, cudaMemcpyHostToDevice));
  void* workspace;
  const DecodePlan plan = plan_and_run(dc.p, tuning, &workspace);
  cudaFree(workspace);
  std::vector<char> out(dc.q_n * es);
  std::vector<float> lse(dc.q_n / c.d);
  CHECK(cudaMemcpy(out.data(), dc.out, dc.q_n * es, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(lse.data(), dc.lse, lse.size() * 4, cudaMemcpyDeviceToHost));
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
      for (int x = 0; x < c.d; ++x) s += double(load(c.dtype, qh.data(), q_off + x)) * load(c.dtype, kh.data(), dc.slot(b, j, h / group, c) + x);
      s *= dc.p.scale;
      if (c.softcap > 0) s = c.softcap * std::tanh(s / c.softcap);
      logits.push_back(s); mx = std::max(mx, s);
    }
    double sum = 0;
    for (int j = 0; j < int(logits.size()); ++j) {
      if (logits[j] == -INFINITY) continue;
      const double w = std::exp(logits[j] - mx); sum += w;
      for (int x = 0; x < c.d; ++x) acc[x] += w * load(c.dtype, vh.data(), dc.slot(b, j, h / group, c) + x);
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
  if (verbose || !ok)
    printf("%-5s B=%d L=%d q_len=%d %d/%d D=%d page=%d window=%lld softcap=%g splits=%lld %s: out err %.2e, lse err %.2e %s\n",
           name(c.dtype), c.b, c.max_len, c.q_len, c.hq, c.hkv, c.d, c.page_size, (long long)c.window, c.softcap,
           (long long)plan.splits, variant_name(plan.tuning).c_str(), max_err, lse_err, ok ? "ok" : "FAIL");
  return ok;
}

// Mean microseconds of `reps` back-to-back calls of `launch` (work on the default stream) between CUDA events, after
// `warmups` untimed ones.
template <typename Launch>
static double mean_us(int warmups, int reps, Launch&& launch) {
  for (int i = 0; i < warmups; ++i) launch();
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start)); CHECK(cudaEventCreate(&stop));
  CHECK(cudaEventRecord(start));
  for (int i = 0; i < reps; ++i) launch();
  CHECK(cudaEventRecord(stop)); CHECK(cudaEventSynchronize(stop));
  float ms; CHECK(cudaEventElapsedTime(&ms, start, stop));
  cudaEventDestroy(start); cudaEventDestroy(stop);
  return ms * 1e3 / reps;
}

// Microseconds per call (after warm-up, 50 back-to-back calls between CUDA events) and the plan, for caches filled
// with one value (bf16 0x3F3F): every output element must be that value too, else *right is false.
static double time_call(const DecodeParams& p, const DecodeTuning* tuning, DecodePlan* used, bool* right) {
  void* workspace;
  const DecodePlan plan = plan_and_run(p, tuning, &workspace);
  *used = plan;
  std::vector<__nv_bfloat16> out(p.batch * p.q_len * p.heads_q * p.cache.head_dim);
  CHECK(cudaMemcpy(out.data(), p.out, out.size() * 2, cudaMemcpyDeviceToHost));
  *right = true;
  for (const __nv_bfloat16& x : out) *right &= std::fabs(__bfloat162float(x) - 0.74609375f) < 1e-2f;
  const double us = mean_us(3, 50, [&] { CHECK(launch_decode(p, plan, workspace, 0)); });
  cudaFree(workspace);
  return us;
}

// Device-to-device copy of 1 GiB (what "the device copy bandwidth" of the targets means), counted as bytes read plus
// bytes written.
static double copy_bandwidth() {
  const size_t bytes = size_t{1} << 30;
  void *src, *dst;
  CHECK(cudaMalloc(&src, bytes)); CHECK(cudaMalloc(&dst, bytes));
  CHECK(cudaMemset(src, 1, bytes));
  const double us = mean_us(1, 10, [&] { CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice)); });
  cudaFree(src); cudaFree(dst);
  printf("device copy (cudaMemcpyAsync D2D, 1 GiB): %.1f us, read+write %.1f GB/s (90%%: %.1f), read alone %.1f GB/s\n",
         us, 2.0 * bytes / us / 1e3, 0.9 * 2.0 * bytes / us / 1e3, bytes / us / 1e3);
  return 2.0 * bytes / us / 1e3;
}

// Reads 2 GiB once per pass, 16 bytes per load, every block striding over the whole buffer: the ceiling of a kernel
// that only reads, as decode nearly does (the copy above also writes).
__global__ void read_all(const uint4* data, size_t n, unsigned* sink) {
  uint32_t acc = 0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    const uint4 x = __ldcs(data + i);
    acc ^= x.x ^ x.y ^ x.z ^ x.w;
  }
  if (acc == 0x12345678u) *sink = acc;  // keeps the loads; never true for the buffer's bytes
}

static void read_bandwidth() {
  const size_t bytes = size_t{2} << 30;
  void* src;
  unsigned* sink;
  CHECK(cudaMalloc(&src, bytes)); CHECK(cudaMalloc(&sink, 4));
  CHECK(cudaMemset(src, 1, bytes));
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  for (int per_sm : {2, 4, 8}) {
    const double us = mean_us(1, 10, [&] {
      read_all<<<sms * per_sm, 2048 / per_sm>>>(static_cast<const uint4*>(src), bytes / 16, sink);
    });
    printf("device read (2 GiB, %d blocks per SM): %.1f GB/s\n", per_sm, bytes / us / 1e3);
  }
  cudaFree(src); cudaFree(sink);
}

struct Bench {
  Case c;
  const char* label;
  double target_gbps;
};

// Fills a benchmark case's caches (one finite value) and sets every length to the capacity.
static void fill_bench_case(const Case& c, DeviceCase& dc) {
  CHECK(cudaMemset(dc.q, 0x3F, dc.q_n * 2)); CHECK(cudaMemset(dc.k, 0x3F, dc.kv_n * 2));
  CHECK(cudaMemset(dc.v, 0x3F, dc.kv_n * 2));
  std::vector<int32_t> lengths(c.b, c.max_len);
  CHECK(cudaMemcpy(dc.lengths, lengths.data(), c.b * 4, cudaMemcpyHostToDevice));
}

// Bytes of K and V one call reads on a benchmark case (every length at the capacity).
static double kv_bytes(const Case& c) { return 2.0 * c.b * c.max_len * c.hkv * c.d * 2; }

// GB/s of K + V read per call on a benchmark case (fresh caches of one value), the plan and whether the output was
// right.
static double bench_gbps(const Case& c, const DecodeTuning* tuning, DecodePlan* plan, bool* right, std::mt19937& gen) {
  DeviceCase dc(c, gen);
  fill_bench_case(c, dc);
  return kv_bytes(c) / time_call(dc.p, tuning, plan, right) / 1e3;
}

// A plan's split count as the tables print it: "(16c)" where the splits combine in clusters.
static std::string splits_label(const DecodePlan& plan) {
  return "(" + std::to_string(plan.splits) + (plan.tuning.cluster_combine ? "c)" : ")");
}

// `--profile LABEL [--kernel NAME] [--waves N]`: only the production plan (or kernel NAME's, splits fastest, N waves
// (1 unless given), the default tuning's combine) on one benchmark case (for ncu: the split kernel's 5th launch is a
// warm one).
static int profile_case(const Bench* bench, int count, const char* label, const char* kernel, int waves,
                        std::mt19937& gen) {
  DecodeTuning chosen = kDefaultDecodeTuning;
  if (kernel) {
    int k = 0;
    while (k < int(DecodeKernel::kCount) && std::strcmp(decode_kernel_name(DecodeKernel(k)), kernel)) ++k;
    if (k == int(DecodeKernel::kCount)) return printf("no kernel %s\n", kernel), 2;
    chosen.kernel = DecodeKernel(k);
  }
  if (waves) chosen.waves = waves;
  const DecodeTuning* tuning = kernel || waves ? &chosen : nullptr;  // null: the production plan
  for (int s = 0; s < count; ++s) {
    if (std::strcmp(bench[s].label, label)) continue;
    DecodePlan plan;
    bool right;
    const double gbps = bench_gbps(bench[s].c, tuning, &plan, &right, gen);
    printf("%s: %s, %s splits, %.0f GB/s%s\n", label, tuning ? variant_name(chosen).c_str() : "production plan",
           splits_label(plan).c_str(), gbps, right ? "" : " WRONG");
    return right ? 0 : 1;
  }
  printf("no benchmark case %s\n", label);
  return 2;
}

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);  // lines reach a log file even if a kernel takes the process down
  bool check_only = false;
  const char* profile_label = nullptr;
  const char* profile_kernel = nullptr;
  int profile_waves = 0;
  int head_dim = 128;  // of the benchmark cases
  for (int i = 1; i < argc; ++i) {
    check_only |= !std::strcmp(argv[i], "--check-only");
    if (!std::strcmp(argv[i], "--head-dim") && i + 1 < argc) head_dim = std::atoi(argv[++i]);
    if (!std::strcmp(argv[i], "--profile") && i + 1 < argc) profile_label = argv[++i];
    if (!std::strcmp(argv[i], "--kernel") && i + 1 < argc) profile_kernel = argv[++i];
    if (!std::strcmp(argv[i], "--waves") && i + 1 < argc) profile_waves = std::atoi(argv[++i]);
    if (!std::strcmp(argv[i], "--bandwidth")) return copy_bandwidth(), read_bandwidth(), 0;
  }
  if (head_dim < 8 || head_dim > 256 || head_dim % 8) return printf("--head-dim: a multiple of 8 up to 256\n"), 2;
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
      {bf16, 3, 1000, 1, 32, 8, 128, 16, -1, 0},   {f16, 4, 77, 1, 32, 8, 128, 0, -1, 0},
      {f16, 3, 96, 1, 8, 1, 256, 16, -1, 0},       {f16, 4, 93, 4, 8, 2, 64, 0, 9, 0},
      {f16, 5, 128, 2, 64, 8, 128, 32, 40, 5.f},   {f16, 1, 30000, 1, 32, 8, 128, 256, -1, 0},
      {f16, 2, 3000, 16, 16, 1, 256, 0, 500, 30.f}, {f16, 4, 200, 7, 8, 2, 120, 32, -1, 0},
      {f32, 4, 77, 1, 32, 8, 128, 0, -1, 0},       {f32, 3, 96, 1, 8, 1, 256, 16, -1, 0},
      {f32, 4, 61, 16, 4, 1, 64, 0, -1, 0},        {f32, 5, 128, 2, 64, 8, 128, 32, 40, 5.f},
      {f32, 1, 20000, 1, 32, 8, 32, 0, -1, 0},     {bf16, 3, 333, 2, 8, 2, 32, 0, -1, 0},
      {bf16, 2, 2500, 1, 32, 8, 200, 32, -1, 0},   {f16, 3, 150, 3, 6, 3, 48, 16, 60, 0},
      {f16, 2, 1500, 1, 16, 4, 136, 0, -1, 10.f}};
  int failures = 0;
  if (!profile_label)
    for (const Case& c : checks) failures += !check_case(c, nullptr, true, gen);

  if (!check_only && !profile_label) copy_bandwidth();
  const int d = head_dim;
  const Bench bench[] = {{{bf16, 8, 4096, 1, 32, 8, d, 0, -1, 0}, "8x4k", 2900},
                         {{bf16, 8, 32768, 1, 32, 8, d, 0, -1, 0}, "8x32k", 3850},
                         {{bf16, 1, 131072, 1, 32, 8, d, 0, -1, 0}, "1x131k", 3850},
                         {{bf16, 64, 8192, 1, 32, 8, d, 0, -1, 0}, "64x8k", 3850},
                         {{bf16, 128, 2048, 1, 32, 8, d, 0, -1, 0}, "128x2k", 3850},
                         {{bf16, 8, 32768, 1, 32, 8, d, 16, -1, 0}, "8x32k/p16", 0.95 * 3850}};
  constexpr int kShapes = sizeof(bench) / sizeof(bench[0]);
  if (profile_label) return profile_case(bench, kShapes, profile_label, profile_kernel, profile_waves, gen);
  double best_score = 0;
  std::string best = "none";
  std::vector<std::pair<double, DecodeTuning>> scored;  // correct variants and their scores
  std::vector<std::pair<double, std::string>> fastest(kShapes, {0.0, "none"});

  // Runs the check cases a tuning serves (fp16/bf16; the two longest, whose host reference takes
  // seconds, only with the production plan) and prints one line; true if all passed.
  auto check_tuning = [&](const DecodeTuning& tuning) {
    printf("checks %-30s: ", variant_name(tuning).c_str());
    fflush(stdout);  // names the variant should it fail a CUDA call
    int run = 0, passed = 0;
    for (const Case& c : checks) {
      if (c.dtype == f32 || c.max_len > 10000) continue;
      ++run, passed += check_case(c, &tuning, false, gen);
    }
    failures += run - passed;
    printf("%d/%d ok\n", passed, run);
    return passed == run;
  };
  // Times every variant on every benchmark case (each case's caches built once) and prints one row per variant.
  auto sweep = [&](const std::vector<DecodeTuning>& variants, const std::vector<bool>& checked) {
    std::vector<std::vector<double>> gbps(variants.size(), std::vector<double>(kShapes));
    std::vector<std::vector<DecodePlan>> plans(variants.size(), std::vector<DecodePlan>(kShapes));
    std::vector<bool> right(variants.size(), true);  // every timed output was the expected value
    for (int s = 0; s < kShapes; ++s) {
      const Case& c = bench[s].c;
      DeviceCase dc(c, gen);
      fill_bench_case(c, dc);  // bf16 0x3F3F (0.746) everywhere
      const double bytes = kv_bytes(c);
      for (size_t v = 0; v < variants.size(); ++v) {
        bool ok;
        gbps[v][s] = bytes / time_call(dc.p, &variants[v], &plans[v][s], &ok) / 1e3;
        if (!ok) right[v] = false, ++failures;
      }
    }
    for (size_t v = 0; v < variants.size(); ++v) {
      const std::string name = variant_name(variants[v]);
      const bool ok = checked[v] && right[v];
      double score = INFINITY;
      printf("%-30s", name.c_str());
      for (int s = 0; s < kShapes; ++s) {
        printf(" %8.0f %5s", gbps[v][s], splits_label(plans[v][s]).c_str());
        score = std::min(score, gbps[v][s] / bench[s].target_gbps);
        if (ok && gbps[v][s] > fastest[s].first) fastest[s] = {gbps[v][s], name};
      }
      printf("  %.3f%s\n", score, !checked[v] ? " (checks failed)" : right[v] ? "" : " (WRONG)");
      if (ok) scored.push_back({score, variants[v]});
      if (ok && score > best_score) best_score = score, best = name;
    }
  };

  // Each kernel is checked with kv heads fastest and two waves, so that the sweep's other grid order and split counts
  // are checked too.
  std::vector<DecodeTuning> variants;
  std::vector<bool> checked;
  for (int k = 0; k < int(DecodeKernel::kCount); ++k) {
    const DecodeTuning checked_tuning{DecodeKernel(k), true, 2, false};
    if (!launches({bf16, 4, 4099, 1, 32, 8, 128, 0, -1, 0}, checked_tuning, gen)) continue;  // left out of the sweep
    const bool ok = check_tuning(checked_tuning);
    for (bool heads_fastest : {false, true})
      for (int waves : {1, 2}) variants.push_back({DecodeKernel(k), heads_fastest, waves, false});
    checked.resize(variants.size(), ok);
  }
  if (!check_only) {
    printf("\nGQA 32/8, D=%d, bf16, one query token: GB/s of K+V read (splits); score = worst ratio to target\n", d);
    printf("%-30s", "variant");
    for (const Bench& b : bench) printf(" %14s", b.label);
    printf("  score\n");
    if (d == 128) {
      printf("%-30s", "cudnn (docs, jax.nn)");
      for (double cudnn : {2523, 3944, 3651, 4265, 4012}) printf(" %14.0f", cudnn);
      printf("\n");
    }
    sweep(variants, checked);
    // The production plan (plan_decode: the default tuning with its per-shape kernel choice).
    printf("%-30s", "production plan");
    for (int s = 0; s < kShapes; ++s) {
      DecodePlan plan;
      bool ok;
      const double gbps = bench_gbps(bench[s].c, nullptr, &plan, &ok, gen);
      if (!ok) ++failures;
      printf(" %8.0f %5s%s", gbps, splits_label(plan).c_str(), ok ? "" : "!");
    }
    printf("\n");
    // Head dims 64 and 256 (the sweep's are 128): the production plan only.
    for (const Bench& other : {Bench{{bf16, 8, 32768, 1, 32, 8, 64, 0, -1, 0}, "8x32k D=64", 0},
                               Bench{{bf16, 1, 131072, 1, 32, 8, 64, 0, -1, 0}, "1x131k D=64", 0},
                               Bench{{bf16, 8, 32768, 1, 32, 8, 256, 0, -1, 0}, "8x32k D=256", 0},
                               Bench{{bf16, 1, 131072, 1, 32, 8, 256, 0, -1, 0}, "1x131k D=256", 0}}) {
      DecodePlan plan;
      bool ok;
      const double gbps = bench_gbps(other.c, nullptr, &plan, &ok, gen);
      if (!ok) ++failures;
      printf("production plan, %-14s %8.0f %5s%s\n", other.label, gbps, splits_label(plan).c_str(), ok ? "" : " WRONG");
    }

    // The three best variants again with the combine launched as a programmatic dependent ("/pdl"), then with each
    // item's splits combined in a thread-block cluster ("/cluster"; the plan falls back to the combine kernel where
    // clusters do not fit, so a row may mix both).
    std::sort(scored.begin(), scored.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
    std::vector<DecodeTuning> best_three;  // copied: the sweeps below add to `scored`
    for (size_t v = 0; v < std::min<size_t>(3, scored.size()); ++v) best_three.push_back(scored[v].second);
    for (bool DecodeTuning::*option : {&DecodeTuning::overlap_combine, &DecodeTuning::cluster_combine}) {
      std::vector<DecodeTuning> changed;
      std::vector<bool> changed_checked;
      for (DecodeTuning tuning : best_three) {
        tuning.*option = true;
        if (!launches({bf16, 4, 4099, 1, 32, 8, 128, 0, -1, 0}, tuning, gen)) break;
        changed.push_back(tuning);
        changed_checked.push_back(check_tuning(tuning));
      }
      if (!changed.empty()) sweep(changed, changed_checked);
    }
    for (int s = 0; s < kShapes; ++s)
      printf("fastest at %-9s: %-30s %.0f GB/s\n", bench[s].label, fastest[s].second.c_str(), fastest[s].first);
    best += " (score " + std::to_string(best_score).substr(0, 5) + ")";
  }
  if (failures) {
    printf("%d CHECKS FAILED; best variant: %s\n", failures, best.c_str());
  } else {
    printf("ALL OK; best variant: %s\n", best.c_str());
  }
  return failures ? 1 : 0;
}
