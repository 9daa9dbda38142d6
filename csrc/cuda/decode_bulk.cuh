// The sm_90 instructions of the bulk-copy decode loader, one thin wrapper each: a transaction-counting mbarrier and
// the 1-D bulk copy (cp.async.bulk, the TMA unit without a tensor map) from global into shared memory. One
// instruction moves a whole key row, so the loads cost a few instructions per tile instead of one per 16 bytes.
// Compiled only for __CUDA_ARCH__ >= 900; the kernels that use them fall back to cp.async below that.
#pragma once

#include <cstdint>

namespace jax_flash::cuda_kernels::decode {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define JAX_FLASH_DECODE_BULK 1
#else
#define JAX_FLASH_DECODE_BULK 0
#endif

#if JAX_FLASH_DECODE_BULK

__device__ __forceinline__ void mbarrier_init(uint32_t barrier, int arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(barrier), "r"(arrivals) : "memory");
}

// Makes initialised barriers visible to the async proxy (the bulk copies complete on them).
__device__ __forceinline__ void mbarrier_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// One arrival that also announces `bytes` of copies to come; the phase completes once they have all landed.
__device__ __forceinline__ void mbarrier_arrive_expect(uint32_t barrier, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(barrier), "r"(bytes) : "memory");
}

// Waits for the phase of the given parity to complete. Bytes announced but never copied would hang the GPU for good;
// after 4M polls (far longer than any real wait) the kernel traps instead, which the launch reports as an error.
__device__ __forceinline__ void mbarrier_wait(uint32_t barrier, uint32_t parity) {
  uint32_t done = 0;
  for (uint32_t polls = 0; !done; ++polls) {
    if (polls == (1u << 22)) __trap();
    asm volatile(
        "{\n"
        ".reg .pred complete;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 complete, [%1], %2;\n"
        "selp.u32 %0, 1, 0, complete;\n"
        "}\n"
        : "=r"(done)
        : "r"(barrier), "r"(parity)
        : "memory");
  }
}

// Orders this thread's earlier generic-proxy accesses to shared memory (reads of a stage) before later async-proxy
// writes (the bulk copies refilling it).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Copies `bytes` (a multiple of 16; both addresses 16-byte aligned) and counts them on `barrier`.
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, uint32_t bytes, uint32_t barrier) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(barrier)
               : "memory");
}

// Starts fetching `bytes` (a multiple of 16, 16-byte aligned) into L2 without a destination or completion.
__device__ __forceinline__ void bulk_prefetch_l2(const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes) : "memory");
}

#endif

}  // namespace jax_flash::cuda_kernels::decode
