// CUDA kernels of `zerocopy::dedup_typed_keys` (see dedup_typed_keys_kernel.cuh).
#include "ops/cuda/dedup_typed_keys_kernel.cuh"

#include <algorithm>

#include "ops/random.h"

namespace zerocopy::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kSharedTypes = 1024;          // per-type counts kept in shared memory up to this many types
constexpr int64_t kMaxCompactBlocks = 1024;  // grid-stride: at most this many blocks add their counts globally

unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

__device__ inline long long key_at(const int64_t* existing, int64_t num_existing, const int64_t* candidates,
                                   int64_t p) {
  return p < num_existing ? existing[p] : candidates[p - num_existing];
}

__global__ void insert_keys_kernel(const int64_t* existing, int64_t num_existing, const int64_t* candidates,
                                   int64_t n, KeyTable table, int64_t* slot, long long* status) {
  const int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p >= n) return;
  const long long key = key_at(existing, num_existing, candidates, p);
  if (key < 0) {
    atomicMin(&status[kDedupNegative], static_cast<long long>(p));
    slot[p] = -1;
    return;
  }
  const uint64_t mask = static_cast<uint64_t>(table.capacity) - 1;
  uint64_t s = rng::mix64(static_cast<uint64_t>(key)) & mask;
  auto* keys = reinterpret_cast<unsigned long long*>(table.keys);
  const auto want = static_cast<unsigned long long>(key);
  const auto empty = static_cast<unsigned long long>(kKeyEmpty);
  while (true) {
    unsigned long long held = *reinterpret_cast<volatile unsigned long long*>(&keys[s]);
    if (held == empty) held = atomicCAS(&keys[s], empty, want);  // the old value: empty when this thread inserted
    if (held == empty || held == want) break;
    s = (s + 1) & mask;
  }
  // a popular key's positions would all queue on one address: only a position below the one seen tries the atomic
  const auto position = static_cast<long long>(p);
  if (position < *reinterpret_cast<volatile long long*>(&table.first[s])) atomicMin(&table.first[s], position);
  slot[p] = static_cast<int64_t>(s);
}

__global__ void flag_first_kernel(int64_t num_existing, int64_t n, const int64_t* slot, KeyTable table,
                                  int64_t* flags, long long* status) {
  const int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p >= n) return;
  const int64_t s = slot[p];
  const bool first = s >= 0 && table.first[s] == p;
  if (p >= num_existing) {
    flags[p - num_existing] = first ? 1 : 0;
  } else if (s >= 0 && !first) {
    atomicMin(&status[kDedupRepeated], static_cast<long long>(p));
  }
}

__global__ void compact_new_kernel(const int64_t* candidates, int64_t num_existing, int64_t num_candidates,
                                   const int64_t* slot, KeyTable table, const int64_t* incl, int64_t num_types,
                                   int64_t* new_keys, int64_t* local, long long* counts) {
  __shared__ unsigned int block_counts[kSharedTypes];
  const bool in_shared = num_types <= kSharedTypes;
  if (in_shared) {
    for (int64_t t = threadIdx.x; t < num_types; t += blockDim.x) block_counts[t] = 0;
  }
  __syncthreads();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t q = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; q < num_candidates; q += stride) {
    const int64_t s = slot[num_existing + q];
    if (s < 0) {  // a negative key: reported by insert_keys_kernel
      local[q] = -1;
      continue;
    }
    const long long first = table.first[s];
    local[q] = first < num_existing ? first : num_existing + incl[first - num_existing] - 1;
    if (first == num_existing + q) {
      const int64_t key = candidates[q];
      new_keys[incl[q] - 1] = key;
      const int64_t type = key % num_types;
      if (in_shared) {
        atomicAdd(&block_counts[type], 1u);
      } else {
        atomicAdd(reinterpret_cast<unsigned long long*>(&counts[type]), 1ull);
      }
    }
  }
  __syncthreads();
  if (in_shared) {
    for (int64_t t = threadIdx.x; t < num_types; t += blockDim.x) {
      if (block_counts[t] != 0) {
        atomicAdd(reinterpret_cast<unsigned long long*>(&counts[t]),
                  static_cast<unsigned long long>(block_counts[t]));
      }
    }
  }
}

}  // namespace

cudaError_t launch_insert_keys(const int64_t* existing, int64_t num_existing, const int64_t* candidates,
                               int64_t num_candidates, KeyTable table, int64_t* slot, long long* status,
                               cudaStream_t stream) {
  const int64_t n = num_existing + num_candidates;
  if (n <= 0) return cudaSuccess;
  insert_keys_kernel<<<blocks_for(n), kThreads, 0, stream>>>(existing, num_existing, candidates, n, table, slot,
                                                              status);
  return cudaGetLastError();
}

cudaError_t launch_flag_first(int64_t num_existing, int64_t num_candidates, const int64_t* slot, KeyTable table,
                              int64_t* flags, long long* status, cudaStream_t stream) {
  const int64_t n = num_existing + num_candidates;
  if (n <= 0) return cudaSuccess;
  flag_first_kernel<<<blocks_for(n), kThreads, 0, stream>>>(num_existing, n, slot, table, flags, status);
  return cudaGetLastError();
}

cudaError_t launch_compact_new(const int64_t* candidates, int64_t num_existing, int64_t num_candidates,
                               const int64_t* slot, KeyTable table, const int64_t* incl, int64_t num_types,
                               int64_t* new_keys, int64_t* local, long long* counts, cudaStream_t stream) {
  if (num_candidates <= 0) return cudaSuccess;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(blocks_for(num_candidates), kMaxCompactBlocks));
  compact_new_kernel<<<blocks, kThreads, 0, stream>>>(
      candidates, num_existing, num_candidates, slot, table, incl, num_types, new_keys, local, counts);
  return cudaGetLastError();
}

}  // namespace zerocopy::cuda
