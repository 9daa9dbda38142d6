// ParallelFor over XLA's intra-op CPU thread pool, for every CPU handler. The calling thread works too and waits
// only for the items, never for pool tasks to start, so a pool busy with other work (or with this very call) cannot
// deadlock it, and tasks that start late find no items left and touch nothing but the shared counters.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>

#include "../cpu/attention_cpu.h"
#include "xla/ffi/api/ffi.h"

namespace jax_flash {

inline ParallelFor pool_parallel_for(::xla::ffi::ThreadPool& pool) {
  return [&pool](int64_t n, const std::function<void(int64_t)>& body) {
    if (n <= 0) return;
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

inline int64_t worker_count(::xla::ffi::ThreadPool& pool) { return pool.num_threads() + 1; }

}  // namespace jax_flash
