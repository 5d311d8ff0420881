// Host-side pieces shared by the two CUDA sampler paths (sample_neighbors_cuda.cpp: per-hop read-backs, any
// fanouts; sample_neighbors_lean.cpp: bounded fanouts, one read-back per batch). CUDA builds only.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

#include "ops/cuda/sample_neighbors_kernel.cuh"

namespace zerocopy {

using CudaSample = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// Raises the error a kernel reported in `status` (cuda::kSampleStatusSlots host entries), if any.
void raise_sample_status(const int64_t* status, int64_t num_nodes, int64_t num_edges);

// A CPU int64 tensor holding `counts`.
at::Tensor counts_tensor(const std::vector<int64_t>& counts);

// The lean path: every fanout >= 1 and the padded pick slots of all hops within a budget; else std::nullopt
// (nothing launched) and the caller takes the per-hop path. `table` is the batch's empty node table (capacity
// >= 2 * node_capacity), `node_capacity` the bound on n_id's length. Synchronizes `stream` once, at the end.
std::optional<CudaSample> sample_neighbors_lean(const cuda::Topology& graph, const at::Tensor& seeds,
                                                c10::IntArrayRef fanouts, bool replace, int64_t seed,
                                                const cuda::NodeTable& table, int64_t node_capacity,
                                                cudaStream_t stream);

// Whether bounded batches take the lean path (default true). Off, every batch takes the per-hop path: for
// benchmarks and tests that compare the two (process-wide; `_C.set_lean_sampler(bool)` returns the old value).
bool lean_sampler_enabled();
bool set_lean_sampler_enabled(bool enabled);

}  // namespace zerocopy
