// The lean path of the CUDA sampler split into its three steps, so that the launches can run directly
// (sample_neighbors_lean.cpp) or be captured once per batch shape in a CUDA graph and replayed
// (sample_neighbors_lean_graph.cpp):
//   lean_shape    bounds of every buffer, from the seed count, fanouts and graph size alone
//   enqueue_lean  allocations and launches for one batch; no host synchronization, nothing read back
//   finish_lean   the one read-back: raises a kernel's error, else the sample (narrowed or copied out)
// CUDA builds only.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "ops/cuda/sample_neighbors/sample_neighbors_glue.h"
#include "ops/cuda/sample_neighbors/sample_neighbors_kernel.cuh"

namespace zerocopy {

// Everything that fixes a lean batch's launches and buffer sizes.
struct LeanShape {
  int64_t num_seeds = 0;
  std::vector<int64_t> fanouts;
  bool replace = false;
  bool node_keyed = false;          // picks keyed by node id, nodes deduplicated per hop (sample_neighbors_kernel.cuh)
  int64_t node_capacity = 0;        // bound on n_id's length
  std::vector<int64_t> max_targets;  // per hop: bound on the frontier
  std::vector<int64_t> max_edges;    // per hop: bound on the sampled edges
  int64_t total_edges = 0;           // sum of max_edges
  int64_t slots = 0;                 // padded pick slots: sum over hops of max_targets * fanout
};

// The bounds, or std::nullopt where a fanout is < 1 or the padded slots exceed the lean budget (the per-hop
// path, which sizes its buffers from the actual counts, then uses less memory).
std::optional<LeanShape> lean_shape(const cuda::Topology& graph, int64_t num_seeds, c10::IntArrayRef fanouts,
                                    bool replace, bool node_keyed, int64_t node_capacity);

// The device buffers one lean batch writes; they must stay alive until its read-back.
struct LeanBatch {
  at::Tensor readback;  // status, then nodes[0..H], then edges[0..H] (cuda::LeanTotals)
  at::Tensor n_id, edge_pos, col, row;
  std::vector<at::Tensor> scratch;  // the node table and the hops' buffers
};

// A [1 + num_seeds] int64 buffer for cuda::LeanInputs, on the seeds' device.
at::Tensor lean_inputs_buffer(const at::Tensor& seeds);

// Writes the random seed and the seed ids into `inputs` (one launch on `stream`).
void fill_lean_inputs(const at::Tensor& seeds, int64_t rng_seed, const at::Tensor& inputs, cudaStream_t stream);

// Allocates the batch's buffers (PyTorch's caching allocator, on the current stream) and launches its kernels on
// `stream`, reading the seeds and the random seed from `inputs`.
LeanBatch enqueue_lean(const cuda::Topology& graph, const LeanShape& shape, const at::Tensor& inputs,
                       cudaStream_t stream);

// Reads back the status and totals (one synchronization of `stream`), raises a reported error, and returns the
// sample: views of the batch's buffers, or copies when `copy_out` (the buffers belong to a CUDA graph and are
// overwritten by its next replay).
CudaSample finish_lean(const LeanBatch& batch, const cuda::Topology& graph, int64_t num_hops, cudaStream_t stream,
                       bool copy_out);

// The lean path through a CUDA graph captured for this batch shape (and graph) the second time the shape is seen
// and replayed after. std::nullopt, with nothing launched, where graphs are off, the shape is seen for the first
// time or is too large to keep a graph's buffers, or its capture failed (then it is not tried again).
std::optional<CudaSample> sample_lean_with_graph(const cuda::Topology& graph, const LeanShape& shape,
                                                 const at::Tensor& seeds, int64_t rng_seed, cudaStream_t stream);

}  // namespace zerocopy
