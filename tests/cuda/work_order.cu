// Host check, no GPU: the persistent Hopper forward's work order (hopper/work_tiles.cuh) hands out every
// (query tile, head, batch) exactly once, keeps each group of (head, batch) pairs together with its query tiles
// heaviest first under a causal mask, and pairs_per_group picks whole groups within the L2 budget. Exit status 0 when
// all hold. tests/test_work_order.py builds and runs it:
//   nvcc -std=c++17 -I csrc tests/cuda/work_order.cu
#include <cstdint>
#include <cstdio>
#include <vector>

#include "cuda/hopper/work_tiles.cuh"

using jax_flash::cuda_kernels::hopper::pairs_per_group;
using jax_flash::cuda_kernels::hopper::WorkOrder;
using jax_flash::cuda_kernels::hopper::WorkTile;

static int failures = 0;

static void expect(bool ok, const char* what, int m_blocks, int heads, int batch, int group) {
  if (!ok) {
    ++failures;
    std::printf("FAILED %s: m_blocks %d, heads %d, batch %d, group %d\n", what, m_blocks, heads, batch, group);
  }
}

static void check_order(int m_blocks, int heads, int batch, int group, bool heaviest_first) {
  const WorkOrder order{m_blocks, heads, batch, group, heaviest_first};
  std::vector<int> seen(size_t(order.count()), 0);
  bool in_range = true, grouped = true, monotone = true;
  int previous_m = -1, previous_group = -1;
  for (int index = 0; index < order.count(); ++index) {
    const WorkTile t = order.tile(index);
    if (t.m_block < 0 || t.m_block >= m_blocks || t.head < 0 || t.head >= heads || t.batch < 0 || t.batch >= batch) {
      in_range = false;
      continue;
    }
    ++seen[size_t((t.batch * heads + t.head) * m_blocks + t.m_block)];
    const int pair_group = (t.batch * heads + t.head) / group;
    // Groups follow each other; within one the query tiles run heaviest (last) first under a causal mask.
    if (pair_group != previous_group) {
      grouped = grouped && pair_group == previous_group + 1;
      previous_group = pair_group;
    } else {
      monotone = monotone && (heaviest_first ? t.m_block <= previous_m : t.m_block >= previous_m);
    }
    previous_m = t.m_block;
  }
  bool once = in_range;
  for (int n : seen) once = once && n == 1;
  expect(once, "every tile handed out once", m_blocks, heads, batch, group);
  expect(grouped, "groups in order", m_blocks, heads, batch, group);
  expect(monotone, "query tiles ordered within a group", m_blocks, heads, batch, group);
}

int main() {
  int cases = 0;
  for (int m_blocks : {1, 3, 8, 128}) {
    for (int heads : {1, 6, 16}) {
      for (int batch : {1, 5}) {
        const int pairs = heads * batch;
        for (int group = 1; group <= pairs; ++group) {
          if (pairs % group != 0) continue;
          for (bool heaviest_first : {false, true}) check_order(m_blocks, heads, batch, group, heaviest_first);
          ++cases;
        }
      }
    }
  }
  // A divisor of the pair count, within the budget, as large as both allow; 1 when even one pair does not fit.
  const int64_t mib = 1 << 20;
  expect(pairs_per_group(16, 8 * mib, 33 * mib) == 4, "16 pairs of 8 MiB in 33 MiB: 4", 0, 16, 1, 0);
  expect(pairs_per_group(16, 8 * mib, 25 * mib) == 2, "16 pairs of 8 MiB in 25 MiB: 2 (3 does not divide)", 0, 16,
         1, 0);
  expect(pairs_per_group(15, 1, 1 << 30) == 15, "small pairs: all in one group", 0, 15, 1, 0);
  expect(pairs_per_group(13, 4 * mib, 33 * mib) == 1, "a prime count above the fit: 1", 0, 13, 1, 0);
  expect(pairs_per_group(8, 64 * mib, 33 * mib) == 1, "a pair larger than the budget: 1", 0, 8, 1, 0);
  expect(pairs_per_group(1, 1, 33 * mib) == 1, "one pair", 0, 1, 1, 0);
  expect(pairs_per_group(int64_t{1} << 20, 1, 33 * mib) == 1024, "many small pairs: kMostPairsPerGroup", 0, 1 << 20,
         1, 0);
  std::printf("%d orders checked, %d failures\n", cases, failures);
  return failures == 0 ? 0 : 1;
}
