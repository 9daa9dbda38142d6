// The persistent forward's schedule: one CTA per SM takes (query tile, head, batch) work tiles until none is left.
// The first gridDim.x tiles go to the CTAs in launch order; after that each CTA's producer takes the next index from
// a per-call counter (zeroed on the stream before the launch), so a CTA that drew short tiles simply takes more,
// as the hardware block scheduler would, while the CTA's own prologue and epilogue overlap its neighbours' loads.
//
// Tiles are numbered query tile fastest, then head, then batch: the CTAs running at one time share a few heads and so
// their K/V in L2. Under a causal mask the query tiles go from the last (the most keys) to the first, so the short
// ones fill in at the end.
#pragma once

#include "tile_tickets.cuh"

namespace jax_flash::cuda_kernels::hopper {

struct WorkTile {
  int m_block, head, batch;
};

struct WorkOrder {
  int m_blocks, heads, batch;
  bool heaviest_first;

  __device__ int count() const { return m_blocks * heads * batch; }
  __device__ WorkTile tile(int index) const {
    const int m = index % m_blocks, rest = index / m_blocks;
    return {heaviest_first ? m_blocks - 1 - m : m, rest % heads, rest / heads};
  }
};

// What the producer tells the consumers about the query tile it loads next, through shared memory beside the Q
// buffer: its work index, whether it has any key tile to see (if not, no Q is loaded and the consumers write zeros),
// or that the CTA is done. Written before the Q "full" arrival and read after the wait on it, like TileTicket.
class WorkTicket {
 public:
  __device__ static WorkTicket done() { return WorkTicket(-1); }
  __device__ static WorkTicket make(int index, bool has_keys) { return WorkTicket(index << 1 | int(!has_keys)); }

  __device__ bool is_done() const { return value_ < 0; }
  __device__ int index() const { return value_ >> 1; }
  __device__ bool has_keys() const { return !(value_ & 1); }

  __device__ void post(int* slot) const { publish(slot, value_); }
  __device__ static WorkTicket read(const int* slot) { return WorkTicket(read_published(slot)); }

 private:
  __device__ explicit WorkTicket(int value) : value_(value) {}
  int value_;
};

}  // namespace jax_flash::cuda_kernels::hopper
