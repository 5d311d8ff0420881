// Argument checks and result type of `zerocopy::dedup_typed_keys` (a typed sample's per-hop deduplication, keys
// `id * num_types + type`), shared by its CPU and CUDA kernels.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <tuple>

namespace zerocopy {

inline constexpr const char* kDedupTypedKeys = "dedup_typed_keys";

// (new_keys, local, type_counts): the candidate keys not among the existing ones, in order of first appearance;
// the local index of every candidate in cat([existing_keys, new_keys]); the new keys per type (key % num_types),
// int64 on the CPU.
using DedupedKeys = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

// Validates what needs no data reads: int64, 1-D, contiguous, one device, num_types >= 1. Raises TypeError (dtype)
// or ValueError, naming the argument. Negative and repeated existing keys are found by the kernels.
void check_dedup_typed_keys_args(const at::Tensor& existing_keys, const at::Tensor& candidate_keys,
                                 int64_t num_types);

// The IndexError of a negative key at `position` of cat([existing_keys, candidate_keys]) (its value `key`).
[[noreturn]] void raise_negative_key(int64_t position, int64_t num_existing, int64_t key);

// The ValueError of existing_keys[position] (`key`) repeating an earlier existing key.
[[noreturn]] void raise_repeated_existing_key(int64_t position, int64_t key);

}  // namespace zerocopy
