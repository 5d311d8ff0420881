// Host-side pieces shared by the two CUDA sampler paths (sample_neighbors_cuda.cpp: per-hop read-backs, any
// fanouts; sample_neighbors_lean.cpp: bounded fanouts, one read-back per batch, replayed from a CUDA graph per
// batch shape by sample_neighbors_lean_graph.cpp) and by pick_neighbors_cuda.cpp. CUDA builds only.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

#include "ops/cuda/sample_neighbors/sample_neighbors_kernel.cuh"

namespace zerocopy {

using CudaSample = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// Raises the error a kernel reported in `status` (cuda::kSampleStatusSlots host entries), if any, as op `op`'s whose
// input node ids are the argument `inputs` ("seeds", "targets").
void raise_sample_status(const int64_t* status, int64_t num_nodes, int64_t num_edges, const char* op,
                         const char* inputs);

// The kernels' view of a CSC (`indptr` int64, `indices` int32 or int64) in GPU memory or in host memory `device`
// can read (else the error names `op` and the tensor).
cuda::Topology topology_view(const at::Tensor& indptr, const at::Tensor& indices, int device, const char* op);

// A CPU int64 tensor holding `counts`.
at::Tensor counts_tensor(const std::vector<int64_t>& counts);

// A batch's global -> local node table and the tensors that hold it.
struct NodeTableStorage {
  at::Tensor keys, values, first;
  cuda::NodeTable table;
};

// An empty table for up to `expected_nodes` nodes, kept at most half full: capacity = the next power of two >=
// max(2 * expected_nodes, 1024). Cleared with three memsets on `stream`.
NodeTableStorage make_node_table(int64_t expected_nodes, const at::TensorOptions& options, cudaStream_t stream);

// The lean path: every fanout >= 1 and the padded pick slots of all hops within a budget; else std::nullopt
// (nothing launched) and the caller takes the per-hop path. `node_capacity` is the bound on n_id's length.
// `node_keyed`: see sample_neighbors_kernel.cuh. Synchronizes `stream` once, at the end.
std::optional<CudaSample> sample_neighbors_lean(const cuda::Topology& graph, const at::Tensor& seeds,
                                                c10::IntArrayRef fanouts, bool replace, int64_t seed, bool node_keyed,
                                                int64_t node_capacity, cudaStream_t stream);

// Whether bounded batches take the lean path (default true). Off, every batch takes the per-hop path: for
// benchmarks and tests that compare the two (process-wide; the op `zerocopy::set_lean_sampler` returns the old value).
bool lean_sampler_enabled();
bool set_lean_sampler_enabled(bool enabled);

// Whether lean batches are captured in a CUDA graph per batch shape and replayed (default true). Off, each lean
// batch launches its kernels directly (process-wide; the op `zerocopy::set_sampler_graphs` returns the old value).
bool sampler_graphs_enabled();
bool set_sampler_graphs_enabled(bool enabled);

// Counters of the CUDA-graph path since the process started (the op `zerocopy::sampler_graph_stats`).
struct SamplerGraphStats {
  int64_t captures = 0;   // shapes captured
  int64_t replays = 0;    // batches sampled by a replay
  int64_t failures = 0;   // captures that failed (those shapes launch directly from then on)
  int64_t evictions = 0;  // graphs dropped to stay within the cache's size
  int64_t cached = 0;     // graphs held now
};
SamplerGraphStats sampler_graph_stats();

}  // namespace zerocopy
