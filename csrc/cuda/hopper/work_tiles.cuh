// The persistent forward's schedule: one CTA per SM takes (query tile, head, batch) work tiles until none is left.
// The first gridDim.x tiles go to the CTAs in launch order; after that each CTA's producer takes the next index from
// a per-call counter (zeroed on the stream before the launch), so a CTA that drew short tiles simply takes more,
// as the hardware block scheduler would, while the CTA's own prologue and epilogue overlap its neighbours' loads.
//
// The backward's blocks take the same order, from blockIdx.x (backward_launch.cuh).
//
// The (head, batch) pairs, head fastest, are cut into groups of `group` pairs whose keys and values fit in L2 together
// (the launches pick it). Within a group the query tile is the slow index and the pair the fast one; the
// groups follow each other. Under a causal mask the query tiles go from the last (the most keys) to the first, so
// each group hands out its heaviest tiles first and its lightest last, and the tail of the kernel is the light tiles
// of the last group: with one pair per group that tail held every query tile of one head, whose heavy tiles (the end
// of a long document, under segment ids) could start on the last wave and leave the other SMs idle.
#pragma once

#include "tile_tickets.cuh"

namespace jax_flash::cuda_kernels::hopper {

struct WorkTile {
  int m_block, head, batch;
};

struct WorkOrder {
  int m_blocks, heads, batch;
  int group;  // (head, batch) pairs per group; divides heads * batch
  bool heaviest_first;  // the last tiles first: the query tiles that see the most keys under a causal mask

  __host__ __device__ int count() const { return m_blocks * heads * batch; }
  __host__ __device__ WorkTile tile(int index) const {
    const int tiles_per_group = m_blocks * group;
    const int in_group = index % tiles_per_group;
    const int m = in_group / group, pair = index / tiles_per_group * group + in_group % group;
    return {heaviest_first ? m_blocks - 1 - m : m, pair % heads, pair / heads};
  }
};

// The largest divisor of `pairs` (so that every group is whole: a short last group would start its heavy tiles late)
// whose pairs' keys and values take at most `budget` bytes, and at least 1. Past kMostPairsPerGroup a group's tiles
// span many waves of the GPU already, and the search stays short.
inline constexpr int64_t kMostPairsPerGroup = 1024;
inline int pairs_per_group(int64_t pairs, int64_t kv_bytes_per_pair, int64_t budget) {
  int64_t g = kv_bytes_per_pair > 0 ? budget / kv_bytes_per_pair : pairs;
  if (g > pairs) g = pairs;
  if (g > kMostPairsPerGroup) g = kMostPairsPerGroup;
  for (; g > 1; --g) {
    if (pairs % g == 0) return int(g);
  }
  return 1;
}

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
