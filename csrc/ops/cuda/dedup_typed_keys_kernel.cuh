// Raw-pointer CUDA kernels of `zerocopy::dedup_typed_keys`. With the n = E + C positions p of
// cat([existing, candidates]) (E existing keys, C candidate keys):
//   1. launch_insert_keys  per position: its key into an open-addressing table (atomicCAS the key), whose entry keeps
//                          the key's smallest position (atomicMin); the position's slot; a negative key is reported
//   2. launch_flag_first   per position: whether it is its key's first; an existing position that is not (a repeated
//                          existing key) is reported; flags[q] for the candidates
//   3. (glue)              incl = inclusive prefix sum of the candidates' flags
//   4. launch_compact_new  per candidate: its local index in cat([existing, new]) (existing first positions are
//                          their own index, a new key's is E + incl[its first candidate] - 1); a first position
//                          writes its key to new_keys[incl - 1] and counts it for its type (key % num_types)
// Reports are the smallest offending position (atomicMin), so the error names what the CPU kernel names. No torch
// headers. The glue is csrc/ops/cuda/dedup_typed_keys_cuda.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace zerocopy::cuda {

// An open-addressing table of `capacity` (a power of two) entries: keys (kKeyEmpty when free) and the smallest
// position of each key (kNoPosition until one is recorded).
struct KeyTable {
  long long* keys = nullptr;
  long long* first = nullptr;
  int64_t capacity = 0;
};

inline constexpr long long kKeyEmpty = -1;                     // all bytes 0xFF
inline constexpr long long kNoPosition = 0x7F7F7F7F7F7F7F7FLL;  // all bytes 0x7F

// status[kDedupNegative]: the smallest position of a negative key; status[kDedupRepeated]: the smallest existing
// position whose key an earlier existing position holds. kNoPosition when none.
inline constexpr int kDedupNegative = 0;
inline constexpr int kDedupRepeated = 1;
inline constexpr int kDedupStatusSlots = 2;

// slot[p] = the table entry of position p's key (-1 for a negative key, reported instead).
cudaError_t launch_insert_keys(const int64_t* existing, int64_t num_existing, const int64_t* candidates,
                               int64_t num_candidates, KeyTable table, int64_t* slot, long long* status,
                               cudaStream_t stream);

// flags[q] = 1 if candidate q is its key's first position, else 0.
cudaError_t launch_flag_first(int64_t num_existing, int64_t num_candidates, const int64_t* slot, KeyTable table,
                              int64_t* flags, long long* status, cudaStream_t stream);

// local[q], new_keys[incl[q] - 1] for first positions, and counts[type] += new keys of the type (counts: int64,
// num_types entries, zeroed by the caller).
cudaError_t launch_compact_new(const int64_t* candidates, int64_t num_existing, int64_t num_candidates,
                               const int64_t* slot, KeyTable table, const int64_t* incl, int64_t num_types,
                               int64_t* new_keys, int64_t* local, long long* counts, cudaStream_t stream);

}  // namespace zerocopy::cuda
