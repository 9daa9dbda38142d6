// CPU handlers: decode operands into params and run the CPU kernels on XLA's own intra-op thread pool.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>

#include "../cpu/attention_cpu.h"
#include "attention_operands.h"
#include "handlers.h"

namespace jax_flash {
namespace {

constexpr PlatformLimits kCpuLimits{256, 1};

// Spreads body(0..n) over XLA's thread pool. The calling thread works too and waits only for the items, never for
// pool tasks to start: a pool busy with other work (or this very call) cannot deadlock it. Tasks that start late
// find no items left and touch nothing but the shared counters.
ParallelFor pool_parallel_for(ffi::ThreadPool& pool) {
  return [&pool](int64_t n, const std::function<void(int64_t)>& body) {
    struct Progress {
      std::atomic<int64_t> next{0};
      std::atomic<int64_t> finished{0};
      std::mutex mutex;
      std::condition_variable all_finished;
    };
    auto progress = std::make_shared<Progress>();
    auto work = [progress, n, &body] {
      for (int64_t i; (i = progress->next.fetch_add(1)) < n;) {
        body(i);
        if (progress->finished.fetch_add(1) + 1 == n) {
          std::lock_guard<std::mutex> lock(progress->mutex);
          progress->all_finished.notify_all();
        }
      }
    };
    const int64_t helpers = std::min<int64_t>(pool.num_threads(), n - 1);
    for (int64_t t = 0; t < helpers; ++t) pool.Schedule([work] { work(); });
    work();
    std::unique_lock<std::mutex> lock(progress->mutex);
    progress->all_finished.wait(lock, [&] { return progress->finished.load() == n; });
  };
}

int64_t worker_count(ffi::ThreadPool& pool) { return pool.num_threads() + 1; }

ffi::Error forward_cpu(ffi::ThreadPool pool, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                       ffi::RemainingArgs tokens, ffi::Result<ffi::AnyBuffer> out,
                       ffi::Result<ffi::Buffer<ffi::F32>> lse, AttentionAttrs attrs) {
  AttentionForwardParams params{};
  if (auto error = decode_forward(kCpuLimits, q, k, v, tokens, *out, *lse, attrs, &params); error.failure())
    return error;
  attention_forward_cpu(params, worker_count(pool), pool_parallel_for(pool));
  return ffi::Error::Success();
}

ffi::Error backward_cpu(ffi::ThreadPool pool, ffi::AnyBuffer dout, ffi::AnyBuffer q, ffi::AnyBuffer k,
                        ffi::AnyBuffer v, ffi::AnyBuffer out, ffi::Buffer<ffi::F32> lse, ffi::RemainingArgs tokens,
                        ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk, ffi::Result<ffi::AnyBuffer> dv,
                        AttentionAttrs attrs) {
  AttentionBackwardParams params{};
  if (auto error = decode_backward(kCpuLimits, dout, q, k, v, out, lse, tokens, *dq, *dk, *dv, attrs, &params);
      error.failure())
    return error;
  attention_backward_cpu(params, worker_count(pool), pool_parallel_for(pool));
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jax_flash

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_flash_attention_forward_cpu, jax_flash::forward_cpu,
                              jax_flash::bind_forward_operands(xla::ffi::Ffi::Bind().Ctx<xla::ffi::ThreadPool>()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_flash_attention_backward_cpu, jax_flash::backward_cpu,
                              jax_flash::bind_backward_operands(xla::ffi::Ffi::Bind().Ctx<xla::ffi::ThreadPool>()));
