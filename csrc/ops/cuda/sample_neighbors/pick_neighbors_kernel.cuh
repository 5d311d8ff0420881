// Raw-pointer CUDA kernels of `zerocopy::pick_neighbors` (one hop of sample_neighbors without deduplication or
// relabeling). With the targets t[0, T):
//   1. launch_count_target_picks  per target: validates it, neighborhood start, degree, number of picks
//   2. (glue)                     offsets = exclusive prefix sum of the picks
//   3. launch_pick_edges          (sample_neighbors_kernel.cuh, hop 0, t0 = 0): edge positions and target positions
//   4. launch_read_neighbors      per edge: the neighbor id (validated)
// No torch headers. The glue is csrc/ops/cuda/sample_neighbors/pick_neighbors_cuda.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "ops/cuda/sample_neighbors/sample_neighbors_kernel.cuh"

namespace zerocopy::cuda {

// For targets[0, count): starts[i], degrees[i] and picks[i]; a target outside [0, num_nodes) is reported
// (kSampleBadSeed: position, value) and gets no picks.
cudaError_t launch_count_target_picks(const int64_t* targets, int64_t count, Topology graph, int64_t fanout,
                                      bool replace, int64_t* starts, int64_t* degrees, int64_t* picks,
                                      long long* status, cudaStream_t stream);

// nbr[e] = indices[edge_pos[e]] for e < *num_edges (a device count, at most `max_edges`, the launch size); a
// neighbor id outside [0, num_nodes) is reported (kSampleBadNeighbor).
cudaError_t launch_read_neighbors(int64_t max_edges, const int64_t* num_edges, const int64_t* edge_pos,
                                  Topology graph, int64_t* nbr, long long* status, cudaStream_t stream);

}  // namespace zerocopy::cuda
