// CUDA kernels of `zerocopy::pick_neighbors` (see pick_neighbors_kernel.cuh). The picks themselves are
// launch_pick_edges of the sampler (sample_neighbors_kernel.cu): the pick policy the CPU kernel calls.
#include "ops/cuda/sample_neighbors/pick_neighbors_kernel.cuh"
#include "ops/cuda/sample_neighbors/sample_neighbors_device.cuh"
#include "ops/pick_policy.h"

namespace zerocopy::cuda {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

__global__ void count_target_picks_kernel(const int64_t* targets, int64_t count, Topology g, int64_t fanout,
                                          bool replace, int64_t* starts, int64_t* degrees, int64_t* picks,
                                          long long* status) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const int64_t node = targets[i];
  if (node < 0 || node >= g.num_nodes) report(status, kSampleBadSeed, i, node, 0);
  int64_t begin, degree;
  const int64_t k = in_neighbors(g, node, status, &begin, &degree) ? pick::num_picks(degree, fanout, replace) : 0;
  starts[i] = begin;
  degrees[i] = degree;
  picks[i] = k;
}

__global__ void read_neighbors_kernel(int64_t max_edges, const int64_t* num_edges, const int64_t* edge_pos,
                                      Topology g, int64_t* nbr, long long* status) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= max_edges || e >= *num_edges) return;
  const int64_t pos = edge_pos[e];
  const int64_t node = load_index(g.indices, g.indices_int64, pos);
  nbr[e] = node;
  if (node < 0 || node >= g.num_nodes) report(status, kSampleBadNeighbor, pos, node, 0);
}

}  // namespace

cudaError_t launch_count_target_picks(const int64_t* targets, int64_t count, Topology graph, int64_t fanout,
                                      bool replace, int64_t* starts, int64_t* degrees, int64_t* picks,
                                      long long* status, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  count_target_picks_kernel<<<blocks_for(count), kThreads, 0, stream>>>(targets, count, graph, fanout, replace,
                                                                         starts, degrees, picks, status);
  return cudaGetLastError();
}

cudaError_t launch_read_neighbors(int64_t max_edges, const int64_t* num_edges, const int64_t* edge_pos,
                                  Topology graph, int64_t* nbr, long long* status, cudaStream_t stream) {
  if (max_edges <= 0) return cudaSuccess;
  read_neighbors_kernel<<<blocks_for(max_edges), kThreads, 0, stream>>>(max_edges, num_edges, edge_pos, graph, nbr,
                                                                         status);
  return cudaGetLastError();
}

}  // namespace zerocopy::cuda
