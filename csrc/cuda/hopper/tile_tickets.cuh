// How a Hopper producer tells its consumers what sits in a ring stage: the tile it loaded, whether it is the last
// one of the CTA's walk, and what masking its scores need. The producer alone walks the tiles (dense ranges, or the
// token-mask walk that skips empty tiles), so the consumers' loops need no walk state of their own.
//
// The ticket is written to shared memory before the stage's "full" mbarrier arrival and read after the consumers'
// wait on it; the arrival releases and the wait acquires, and the volatile accesses with compiler fences keep the
// compiler from moving them across the barrier instructions (CUTLASS's barrier asm declares no memory effects).
#pragma once

namespace jax_flash::cuda_kernels::hopper {

// A word of shared memory handed from the producer to the consumers across an mbarrier (see above).
__device__ __forceinline__ void publish(int* slot, int value) {
  asm volatile("" ::: "memory");
  *reinterpret_cast<volatile int*>(slot) = value;
  asm volatile("" ::: "memory");
}

__device__ __forceinline__ int read_published(const int* slot) {
  asm volatile("" ::: "memory");
  const int value = *reinterpret_cast<const volatile int*>(slot);
  asm volatile("" ::: "memory");
  return value;
}

enum class TileMasking : int {
  kNone = 0,    // every (query, key) pair of the tile is visible
  kWindow = 1,  // the tile straddles the sequence end or a window edge: mask by position
  kTokens = 2,  // a partial tile under a token mask: mask by the tokens' lengths, segment ids and positions
};

class TileTicket {
 public:
  // What the producer posts when its CTA has no tile to walk; the consumers then skip their loops.
  __device__ static TileTicket none() { return TileTicket(-1); }
  __device__ static TileTicket make(int tile, bool last, TileMasking masking) {
    return TileTicket(tile << 3 | int(last) << 2 | int(masking));
  }

  __device__ bool is_none() const { return value_ < 0; }
  __device__ int tile() const { return value_ >> 3; }
  __device__ bool last() const { return (value_ >> 2) & 1; }
  __device__ TileMasking masking() const { return TileMasking(value_ & 3); }

  __device__ void post(int* slot) const { publish(slot, value_); }
  __device__ static TileTicket read(const int* slot) { return TileTicket(read_published(slot)); }

 private:
  __device__ explicit TileTicket(int value) : value_(value) {}
  int value_;
};

}  // namespace jax_flash::cuda_kernels::hopper
