#include "tile_math.h"

#include <cmath>
#include <cstring>

// The wheel must run on any x86-64, but the kernels should use AVX2/AVX-512 where present: GCC/Clang build each
// hot function once per level listed here and pick one at load time.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define JAX_FLASH_MULTIVERSION __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define JAX_FLASH_MULTIVERSION
#endif

namespace jax_flash::cpu {
namespace {

// One 32-byte register of T (eight floats or four doubles); the compiler maps it to one AVX register, or two SSE
// registers on the baseline level.
template <typename T>
struct Vec {
  typedef T type __attribute__((vector_size(32), aligned(alignof(T))));
  static constexpr int kLanes = 32 / sizeof(T);
};

template <typename T>
__attribute__((always_inline)) inline typename Vec<T>::type load(const T* p) {
  typename Vec<T>::type v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <typename T>
__attribute__((always_inline)) inline void store(T* p, typename Vec<T>::type v) { std::memcpy(p, &v, sizeof v); }

// Accumulates ROWS rows of C over the columns [0, n): two registers of columns at a time, then one, then scalars;
// each element sums its k products in order. Always inlined so it is compiled inside each multiversioned caller
// with that caller's instruction set.
template <int ROWS, typename T>
__attribute__((always_inline)) inline void gemm_rows(T* c, int64_t ldc, const T* a, int64_t lda, const T* b,
                                                     int64_t ldb, int64_t n, int64_t k) {
  using V = typename Vec<T>::type;
  constexpr int kLanes = Vec<T>::kLanes;
  int64_t j = 0;
  for (; j + 2 * kLanes <= n; j += 2 * kLanes) {
    V acc[ROWS][2];
    for (int r = 0; r < ROWS; ++r) {
      acc[r][0] = load(c + r * ldc + j);
      acc[r][1] = load(c + r * ldc + j + kLanes);
    }
    for (int64_t p = 0; p < k; ++p) {
      V b0 = load(b + p * ldb + j), b1 = load(b + p * ldb + j + kLanes);
      for (int r = 0; r < ROWS; ++r) {
        T x = a[r * lda + p];
        acc[r][0] += x * b0;
        acc[r][1] += x * b1;
      }
    }
    for (int r = 0; r < ROWS; ++r) {
      store(c + r * ldc + j, acc[r][0]);
      store(c + r * ldc + j + kLanes, acc[r][1]);
    }
  }
  for (; j + kLanes <= n; j += kLanes) {
    V acc[ROWS];
    for (int r = 0; r < ROWS; ++r) acc[r] = load(c + r * ldc + j);
    for (int64_t p = 0; p < k; ++p) {
      V b0 = load(b + p * ldb + j);
      for (int r = 0; r < ROWS; ++r) acc[r] += a[r * lda + p] * b0;
    }
    for (int r = 0; r < ROWS; ++r) store(c + r * ldc + j, acc[r]);
  }
  for (; j < n; ++j) {
    for (int r = 0; r < ROWS; ++r) {
      T sum = c[r * ldc + j];
      for (int64_t p = 0; p < k; ++p) sum += a[r * lda + p] * b[p * ldb + j];
      c[r * ldc + j] = sum;
    }
  }
}

// exp(x) for x <= 0 as 2^n * e^r with |r| <= ln2/2 and a degree-6 Taylor/Cephes polynomial: about 1 ulp in float32,
// and written without library calls so the loop around it vectorizes.
__attribute__((always_inline)) inline float exp_nonpositive(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;
  constexpr float kLn2Lo = -2.12194440e-4f;
  x = x < -87.3f ? -87.3f : x;  // below this e^x is < FLT_MIN; callers zero -inf inputs separately
  float n = __builtin_floorf(x * kLog2e + 0.5f);
  float r = x - n * kLn2Hi - n * kLn2Lo;
  float poly = 1.9875691500e-4f;
  poly = poly * r + 1.3981999507e-3f;
  poly = poly * r + 8.3334519073e-3f;
  poly = poly * r + 4.1665795894e-2f;
  poly = poly * r + 1.6666665459e-1f;
  poly = poly * r + 5.0000001201e-1f;
  float er = poly * r * r + r + 1.f;
  int32_t bits = (int32_t(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return er * scale;
}

// Six rows x two registers keeps 12 accumulators plus operands inside the 16 AVX registers.
template <typename T>
__attribute__((always_inline)) inline void gemm_row_blocks(T* c, int64_t ldc, const T* a, int64_t lda, const T* b,
                                                           int64_t ldb, int64_t m, int64_t n, int64_t k) {
  int64_t i = 0;
  for (; i + 6 <= m; i += 6) gemm_rows<6>(c + i * ldc, ldc, a + i * lda, lda, b, ldb, n, k);
  for (; i + 2 <= m; i += 2) gemm_rows<2>(c + i * ldc, ldc, a + i * lda, lda, b, ldb, n, k);
  for (; i < m; ++i) gemm_rows<1>(c + i * ldc, ldc, a + i * lda, lda, b, ldb, n, k);
}

}  // namespace

JAX_FLASH_MULTIVERSION
void gemm_accumulate(float* c, int64_t ldc, const float* a, int64_t lda, const float* b, int64_t ldb, int64_t m,
                     int64_t n, int64_t k) {
  gemm_row_blocks(c, ldc, a, lda, b, ldb, m, n, k);
}

JAX_FLASH_MULTIVERSION
void gemm_accumulate(double* c, int64_t ldc, const double* a, int64_t lda, const double* b, int64_t ldb, int64_t m,
                     int64_t n, int64_t k) {
  gemm_row_blocks(c, ldc, a, lda, b, ldb, m, n, k);
}

JAX_FLASH_MULTIVERSION
float exp_shifted_sum(float* x, int64_t n, float shift) {
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] == -INFINITY ? 0.f : exp_nonpositive(x[i] - shift);
  // Eight running sums instead of one so the reduction vectorizes without reassociation flags.
  Vec<float>::type partial = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) partial += load(x + i);
  float sum = 0.f;
  for (int lane = 0; lane < 8; ++lane) sum += partial[lane];
  for (; i < n; ++i) sum += x[i];
  return sum;
}

void transpose(const float* src, int64_t ld_src, int64_t m, int64_t n, float* dst, int64_t ld_dst) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) dst[j * ld_dst + i] = src[i * ld_src + j];
}

}  // namespace jax_flash::cpu
