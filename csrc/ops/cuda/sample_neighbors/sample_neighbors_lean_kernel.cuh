// Raw-pointer CUDA kernels of the lean path of `zerocopy::sample_neighbors`: every fanout >= 1, so each hop's
// sizes have bounds known before the first launch, and the whole batch runs without a host synchronization.
//
// Frontier sizes and edge counts stay on the GPU (LeanTotals); kernels are launched over the bounds and read the
// actual counts there. Per hop, with F = frontier bound and P = F * fanout padded pick slots:
//   1. launch_lean_count_pick   per target: degree, number of picks, and the picks themselves (pick policy of
//                               ops/pick_policy.h, the CPU kernel's), written to the target's padded slots
//   2. (glue)                   incl_picks = inclusive prefix sum of the pick counts (zero beyond the frontier)
//   3. launch_lean_insert       per padded slot: dense edge index, edge_pos/col out, neighbor id (validated) into
//                               the batch's table; a node new in this hop records its smallest edge index
//   4. launch_lean_flag         per edge: 1 where the edge is its node's first appearance in this hop
//   5. (glue)                   incl_flags = inclusive prefix sum of the flags
//   6. launch_lean_finalize     per edge: row; first appearances append to n_id; thread 0 advances LeanTotals
// The glue reads back once, after the last hop: the error status and the totals.
//
// A batch's inputs (the seeds and the random seed) are read from one device buffer that launch_lean_inputs
// fills, so the launches after it take only pointers fixed by the batch's shape and can be captured in a CUDA
// graph once per shape and replayed (sample_neighbors_lean_graph.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "ops/cuda/sample_neighbors/sample_neighbors_kernel.cuh"

namespace zerocopy::cuda {

// The batch's running totals in device memory: nodes[h] = entries of n_id after hop h - 1 (nodes[0] = the
// seeds), edges[h] = edges sampled before hop h (edges[0] = 0); num_hops + 1 entries each.
struct LeanTotals {
  long long* nodes = nullptr;
  long long* edges = nullptr;
};

// One hop's arguments and scratch buffers (device memory, sized by the bounds).
struct LeanHop {
  int64_t hop = 0;
  int64_t fanout = 1;
  bool replace = false;
  bool node_keyed = false;            // picks keyed by node id (pick::target_key)
  int64_t key_offset = 0;             // added to a neighbor's id for its table key: (hop + 1) * num_nodes when
                                      // node-keyed (nodes deduplicated per hop), else 0
  const int64_t* rng_seed = nullptr;  // [1] device: the batch's random seed (LeanInputs)
  int64_t max_targets = 0;         // bound on the frontier size (F)
  int64_t max_edges = 0;           // bound on the hop's edges (<= F * fanout)
  int64_t max_nodes = 0;           // capacity of n_id (exceeded only with bad or repeated seeds)
  int64_t* picks = nullptr;        // [F] picks per target
  int64_t* padded_pos = nullptr;   // [F * fanout] target i's picks at i * fanout
  int64_t* scratch = nullptr;      // [pick::kScratchPerPick * F * fanout] when the pick policy needs it, else null
  int64_t* incl_picks = nullptr;   // [F] inclusive prefix sum of picks
  int64_t* nbr = nullptr;          // [max_edges] neighbor ids
  int64_t* slot = nullptr;         // [max_edges] table slots (-1: bad neighbor)
  int32_t* flags = nullptr;        // [max_edges]
  int64_t* incl_flags = nullptr;   // [max_edges] inclusive prefix sum of flags
};

// A batch's inputs in device memory, 1 + n int64: the random seed, then the n seed node ids.
struct LeanInputs {
  int64_t* data = nullptr;  // data[0]: the random seed; data + 1: the seed node ids
  int64_t num_seeds = 0;
};

// inputs = [rng_seed, seeds[0], ..., seeds[n - 1]].
cudaError_t launch_lean_inputs(const int64_t* seeds, int64_t n, int64_t rng_seed, LeanInputs inputs,
                               cudaStream_t stream);

// n_id[i] = seeds[i], table[seeds[i]] = i (validated into `status`); sets nodes[0] = n and edges[0] = 0.
cudaError_t launch_lean_seeds(LeanInputs inputs, int64_t num_nodes, NodeTable table, int64_t* n_id,
                              long long* status, LeanTotals totals, cudaStream_t stream);

cudaError_t launch_lean_count_pick(const LeanHop& hop, const int64_t* n_id, Topology graph, LeanTotals totals,
                                   long long* status, cudaStream_t stream);

// Writes edge_pos and col of the hop's edges at edges[hop] + (dense edge index).
cudaError_t launch_lean_insert(const LeanHop& hop, Topology graph, NodeTable table, LeanTotals totals,
                               int64_t* edge_pos, int64_t* col, long long* status, cudaStream_t stream);

cudaError_t launch_lean_flag(const LeanHop& hop, NodeTable table, cudaStream_t stream);

// Writes row at edges[hop] + (dense edge index), appends new nodes to n_id, and sets nodes[hop + 1] and
// edges[hop + 1].
cudaError_t launch_lean_finalize(const LeanHop& hop, NodeTable table, LeanTotals totals, int64_t* row,
                                 int64_t* n_id, long long* status, cudaStream_t stream);

}  // namespace zerocopy::cuda
