// Device helpers shared by the CUDA sampler's kernels (sample_neighbors_kernel.cu, sample_neighbors_lean_kernel.cu):
// the error slot, the batch's global -> local hash table, a node's CSC range and reading one neighbor id. CUDA sources only.
#pragma once

#include <cstdint>

#include "ops/cuda/sample_neighbors/sample_neighbors_kernel.cuh"
#include "ops/random.h"

namespace zerocopy::cuda {

__device__ inline void report(long long* status, long long code, long long a, long long b, long long c) {
  if (atomicCAS(reinterpret_cast<unsigned long long*>(status), 0ull, static_cast<unsigned long long>(code)) == 0ull) {
    status[1] = a;
    status[2] = b;
    status[3] = c;
  }
}

// Finds or inserts `key`; returns its slot and whether this call inserted it.
__device__ inline int64_t table_insert(const NodeTable& t, long long key, bool* inserted) {
  const uint64_t mask = static_cast<uint64_t>(t.capacity) - 1;
  uint64_t s = rng::mix64(static_cast<uint64_t>(key)) & mask;
  while (true) {
    const long long k = __ldcg(t.keys + s);
    if (k == key) {
      *inserted = false;
      return static_cast<int64_t>(s);
    }
    if (k == -1) {
      const long long prev = static_cast<long long>(atomicCAS(reinterpret_cast<unsigned long long*>(t.keys + s),
                                                              ~0ull, static_cast<unsigned long long>(key)));
      if (prev == -1) {
        *inserted = true;
        return static_cast<int64_t>(s);
      }
      if (prev == key) {
        *inserted = false;
        return static_cast<int64_t>(s);
      }
    }
    s = (s + 1) & mask;
  }
}

// The CSC range [*begin, *begin + *degree) of `node`'s in-neighbors. False, with an empty range, for a node outside
// [0, num_nodes) (never indexed with; the caller reports it where it is the caller's input) and for a bad `indptr`
// entry (reported here).
__device__ inline bool in_neighbors(const Topology& g, int64_t node, long long* status, int64_t* begin,
                                    int64_t* degree) {
  *begin = 0;
  *degree = 0;
  if (node < 0 || node >= g.num_nodes) return false;
  const int64_t b = g.indptr[node];
  const int64_t e = g.indptr[node + 1];
  if (!(0 <= b && b <= e && e <= g.num_edges)) {
    report(status, kSampleBadIndptr, node, b, e);
    return false;
  }
  *begin = b;
  *degree = e - b;
  return true;
}

__device__ __forceinline__ int64_t load_index(const void* indices, bool is64, int64_t pos) {
  return is64 ? static_cast<const int64_t*>(indices)[pos]
              : static_cast<int64_t>(static_cast<const int32_t*>(indices)[pos]);
}

// n_id[i] = seeds[i] and table[seeds[i]] = i, reporting a seed out of [0, num_nodes) or seen before.
__device__ inline void insert_seed(const int64_t* seeds, int64_t i, int64_t num_nodes, const NodeTable& table,
                                   int64_t* n_id, long long* status) {
  const int64_t node = seeds[i];
  n_id[i] = node;
  if (node < 0 || node >= num_nodes) {
    report(status, kSampleBadSeed, i, node, 0);
    return;
  }
  bool inserted = false;
  const int64_t s = table_insert(table, node, &inserted);
  if (!inserted) {
    report(status, kSampleDuplicateSeed, i, node, 0);
    return;
  }
  table.values[s] = i;
}

}  // namespace zerocopy::cuda
