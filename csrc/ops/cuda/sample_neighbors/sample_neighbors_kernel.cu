// CUDA kernels of `zerocopy::sample_neighbors` (see sample_neighbors_kernel.cuh for the per-hop plan).
//
// Picks are drawn per target by pick::pick_positions (ops/pick_policy.h), the function the CPU kernel calls, so
// for equal inputs the GPU sample is bitwise the CPU sample. Relabeling keeps the CPU
// order (seeds, then each hop's new nodes by first appearance in edge order) without any sequential pass: a
// new node's local id is the number of first appearances before its own, from a prefix sum of flags.
//
// Every index that leads to a memory read is checked first (seeds, indptr entries, neighbor ids); a bad one is
// reported through the status slot and never dereferenced.
#include "ops/cuda/sample_neighbors/sample_neighbors_device.cuh"
#include "ops/cuda/sample_neighbors/sample_neighbors_kernel.cuh"
#include "ops/pick_policy.h"
#include "ops/random.h"

namespace zerocopy::cuda {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

__global__ void insert_seeds_kernel(const int64_t* seeds, int64_t n, int64_t num_nodes, NodeTable table,
                                    int64_t* n_id, long long* status) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  insert_seed(seeds, i, num_nodes, table, n_id, status);
}

__global__ void count_picks_kernel(const int64_t* n_id, int64_t t0, int64_t count, Topology g, int64_t fanout,
                                   bool replace, int64_t* starts, int64_t* degrees, int64_t* picks,
                                   long long* status) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const int64_t node = n_id[t0 + i];  // a bad seed is already reported
  int64_t begin, degree;
  const int64_t k = in_neighbors(g, node, status, &begin, &degree) ? pick::num_picks(degree, fanout, replace) : 0;
  starts[i] = begin;
  degrees[i] = degree;
  picks[i] = k;
}

__global__ void pick_edges_kernel(int64_t count, const int64_t* n_id, const int64_t* starts, const int64_t* degrees,
                                  const int64_t* offsets, int64_t fanout, bool replace, uint64_t seed, int64_t hop,
                                  bool node_keyed, int64_t t0, int64_t* edge_pos, int64_t* col, int64_t* scratch) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const int64_t first = offsets[i];
  const int64_t k = offsets[i + 1] - first;
  if (k == 0) return;
  for (int64_t j = 0; j < k; ++j) col[first + j] = t0 + i;
  int64_t* own_scratch = scratch == nullptr ? nullptr : scratch + pick::kScratchPerPick * first;
  const uint64_t key = pick::target_key(seed, hop, i, n_id[t0 + i], node_keyed);
  pick::pick_positions(key, starts[i], degrees[i], fanout, replace, k, edge_pos + first, own_scratch);
}

__global__ void insert_edges_kernel(int64_t num_edges, const int64_t* edge_pos, Topology g, NodeTable table,
                                    int64_t key_offset, int64_t* nbr, int64_t* slot, long long* status) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= num_edges) return;
  const int64_t pos = edge_pos[e];
  const int64_t node = load_index(g.indices, g.indices_int64, pos);
  nbr[e] = node;
  if (node < 0 || node >= g.num_nodes) {
    report(status, kSampleBadNeighbor, pos, node, 0);
    slot[e] = -1;
    return;
  }
  bool inserted = false;
  const int64_t s = table_insert(table, node + key_offset, &inserted);
  slot[e] = s;
  if (__ldcg(table.values + s) < 0) {
    atomicMin(reinterpret_cast<unsigned long long*>(table.first + s), static_cast<unsigned long long>(e));
  }
}

__global__ void flag_first_kernel(int64_t num_edges, const int64_t* slot, NodeTable table, int32_t* flags) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= num_edges) return;
  const int64_t s = slot[e];
  flags[e] = (s >= 0 && table.values[s] < 0 && table.first[s] == e) ? 1 : 0;
}

__global__ void finalize_kernel(int64_t num_edges, const int64_t* nbr, const int64_t* slot, const int64_t* incl,
                                int64_t n_before, NodeTable table, int64_t* row, int64_t* n_id) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= num_edges) return;
  const int64_t s = slot[e];
  if (s < 0) {
    row[e] = -1;  // a bad neighbor id: the call raises
    return;
  }
  const long long v = __ldcg(table.values + s);
  if (v >= 0) {  // known before this hop, or already numbered by its first edge (same value either way)
    row[e] = v;
    return;
  }
  const long long f = table.first[s];
  const int64_t local = n_before + incl[f] - 1;
  row[e] = local;
  if (f == e) {
    n_id[local] = nbr[e];
    table.values[s] = local;
  }
}

}  // namespace

cudaError_t launch_insert_seeds(const int64_t* seeds, int64_t n, int64_t num_nodes, NodeTable table,
                                int64_t* n_id, long long* status, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  insert_seeds_kernel<<<blocks_for(n), kThreads, 0, stream>>>(seeds, n, num_nodes, table, n_id, status);
  return cudaGetLastError();
}

cudaError_t launch_count_picks(const int64_t* n_id, int64_t t0, int64_t count, Topology graph, int64_t fanout,
                               bool replace, int64_t* starts, int64_t* degrees, int64_t* picks,
                               long long* status, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  count_picks_kernel<<<blocks_for(count), kThreads, 0, stream>>>(n_id, t0, count, graph, fanout, replace, starts,
                                                                  degrees, picks, status);
  return cudaGetLastError();
}

cudaError_t launch_pick_edges(int64_t count, const int64_t* n_id, const int64_t* starts, const int64_t* degrees,
                              const int64_t* offsets, int64_t fanout, bool replace, uint64_t seed, int64_t hop,
                              bool node_keyed, int64_t t0, int64_t* edge_pos, int64_t* col, int64_t* scratch,
                              cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  // Small blocks: one thread per target does a serial draw, so spread targets over many multiprocessors.
  constexpr int kPickThreads = 64;
  const unsigned blocks = static_cast<unsigned>((count + kPickThreads - 1) / kPickThreads);
  pick_edges_kernel<<<blocks, kPickThreads, 0, stream>>>(count, n_id, starts, degrees, offsets, fanout, replace,
                                                         seed, hop, node_keyed, t0, edge_pos, col, scratch);
  return cudaGetLastError();
}

cudaError_t launch_insert_edges(int64_t num_edges, const int64_t* edge_pos, Topology graph, NodeTable table,
                                int64_t key_offset, int64_t* nbr, int64_t* slot, long long* status,
                                cudaStream_t stream) {
  if (num_edges <= 0) return cudaSuccess;
  insert_edges_kernel<<<blocks_for(num_edges), kThreads, 0, stream>>>(num_edges, edge_pos, graph, table, key_offset,
                                                                      nbr, slot, status);
  return cudaGetLastError();
}

cudaError_t launch_flag_first(int64_t num_edges, const int64_t* slot, NodeTable table, int32_t* flags,
                              cudaStream_t stream) {
  if (num_edges <= 0) return cudaSuccess;
  flag_first_kernel<<<blocks_for(num_edges), kThreads, 0, stream>>>(num_edges, slot, table, flags);
  return cudaGetLastError();
}

cudaError_t launch_finalize(int64_t num_edges, const int64_t* nbr, const int64_t* slot, const int64_t* incl,
                            int64_t n_before, NodeTable table, int64_t* row, int64_t* n_id, cudaStream_t stream) {
  if (num_edges <= 0) return cudaSuccess;
  finalize_kernel<<<blocks_for(num_edges), kThreads, 0, stream>>>(num_edges, nbr, slot, incl, n_before, table, row,
                                                                  n_id);
  return cudaGetLastError();
}

}  // namespace zerocopy::cuda
