// Host check, no GPU: the fused Hopper backward writes dS^T with four stmatrix per thread and computes only the
// first address (backward_kernel.cuh). This checks, for every consumer thread of each fused configuration, that the
// other stores' addresses are the first one's XOR the store step, and the second buffer's those of the first plus
// kScoreGradientBufferBytes, against CuTe's own swizzled addresses (score_gradient_targets). Exit status 0 when all
// hold. tests/test_score_gradient_stores.py builds and runs it:
//   nvcc -std=c++17 --expt-relaxed-constexpr -I csrc -isystem <cutlass include> tests/cuda/score_gradient_stores.cu
#include <cstdint>
#include <cstdio>

#include <cute/tensor.hpp>

#include "cuda/hopper/backward_config.cuh"

using namespace cute;
using namespace jax_flash::cuda_kernels::hopper;

// The configuration the fused kernel runs in (generate_instantiations.py's BACKWARD_TILES at head dim 128).
template <typename Element>
using Fused = FusedBackwardConfig<BackwardConfig<Element, 128, 128, 64, 2>>;

template <class Config>
int count_mismatches(const char* name) {
  using Element = typename Config::Element;
  // A 1024-byte aligned stand-in for the shared buffers: the swizzle reads address bits, so alignment matters.
  alignas(1024) static Element buffers[cosize_v<typename Config::ScoreGradientLayout>];
  const auto byte = [&](Element const& e) {
    return static_cast<uint32_t>(reinterpret_cast<const char*>(&e) - reinterpret_cast<const char*>(buffers));
  };
  int mismatches = 0;
  for (int thread = 0; thread < Config::kConsumerThreads; ++thread) {
    Tensor targets = score_gradient_targets<Config>(thread, buffers);  // ((8, stores), 1, 1, buffer)
    static_assert(size<1>(decltype(targets){}) == 1 && size<2>(decltype(targets){}) == 1);
    const uint32_t first = byte(targets(make_coord(0, 0), 0, 0, 0));
    for (int buffer = 0; buffer < size<3>(targets); ++buffer) {
      for (int store = 0; store < size<0, 1>(targets); ++store) {
        const uint32_t expected =
            (first ^ (store * Config::kScoreGradientStoreStep)) + buffer * Config::kScoreGradientBufferBytes;
        const uint32_t actual = byte(targets(make_coord(0, store), 0, 0, buffer));
        if (actual != expected && ++mismatches <= 5) {
          std::printf("%s: thread %d store %d buffer %d at byte %u, derived %u\n", name, thread, store, buffer,
                      actual, expected);
        }
      }
    }
  }
  std::printf("%s: %d mismatches over %d threads\n", name, mismatches, Config::kConsumerThreads);
  return mismatches;
}

int main() {
  const int mismatches = count_mismatches<Fused<cutlass::bfloat16_t>>("bfloat16") +
                         count_mismatches<Fused<cutlass::half_t>>("float16");
  return mismatches == 0 ? 0 : 1;
}
