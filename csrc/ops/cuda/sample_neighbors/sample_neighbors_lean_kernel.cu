// CUDA kernels of the lean sampler path (see sample_neighbors_lean_kernel.cuh for the per-hop plan). Each kernel
// is launched over a bound and reads the actual frontier or edge count from LeanTotals / the prefix sums, so no
// count has to come back to the host between launches. Picks, relabeling and the order of n_id are those of
// sample_neighbors_kernel.cu (and so of the CPU kernel), bitwise.
#include "ops/cuda/sample_neighbors/sample_neighbors_device.cuh"
#include "ops/cuda/sample_neighbors/sample_neighbors_lean_kernel.cuh"
#include "ops/pick_policy.h"

namespace zerocopy::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kPickThreads = 64;  // one thread per target draws serially: spread targets over many SMs

// At least one block, so kernels that advance LeanTotals always run.
unsigned blocks_for(int64_t n, int threads) {
  return static_cast<unsigned>(n > 0 ? (n + threads - 1) / threads : 1);
}

__device__ __forceinline__ int64_t global_id() { return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }

__device__ __forceinline__ int64_t frontier_begin(const LeanTotals& t, int64_t hop) {
  return hop == 0 ? 0 : static_cast<int64_t>(t.nodes[hop - 1]);
}

// Edges of the hop (the last inclusive prefix sum of the pick counts), at most max_edges.
__device__ __forceinline__ int64_t hop_edges(const LeanHop& h) {
  if (h.max_targets == 0) return 0;
  const int64_t e = h.incl_picks[h.max_targets - 1];
  return e < h.max_edges ? e : h.max_edges;
}

__global__ void lean_inputs_kernel(const int64_t* seeds, int64_t n, int64_t rng_seed, int64_t* inputs) {
  const int64_t i = global_id();
  if (i == 0) inputs[0] = rng_seed;
  if (i < n) inputs[i + 1] = seeds[i];
}

__global__ void lean_seeds_kernel(LeanInputs inputs, int64_t num_nodes, NodeTable table, int64_t* n_id,
                                  long long* status, LeanTotals totals) {
  const int64_t i = global_id();
  const int64_t n = inputs.num_seeds;
  if (i == 0) {
    totals.nodes[0] = n;
    totals.edges[0] = 0;
  }
  if (i >= n) return;
  insert_seed(inputs.data + 1, i, num_nodes, table, n_id, status);
}

__global__ void lean_count_pick_kernel(LeanHop h, const int64_t* n_id, Topology g, LeanTotals totals,
                                       long long* status) {
  const int64_t i = global_id();
  const int64_t t0 = frontier_begin(totals, h.hop);
  const int64_t frontier = static_cast<int64_t>(totals.nodes[h.hop]) - t0;
  if (i == 0 && frontier > h.max_targets) report(status, kSampleBoundExceeded, h.hop, frontier, h.max_targets);
  if (i >= h.max_targets) return;
  const auto seed = static_cast<uint64_t>(*h.rng_seed);
  int64_t k = 0;
  if (i < frontier) {
    const int64_t node = n_id[t0 + i];  // a bad seed is already reported
    int64_t b, degree;
    if (in_neighbors(g, node, status, &b, &degree)) {
      k = pick::num_picks(degree, h.fanout, h.replace);
      int64_t* scratch = h.scratch == nullptr ? nullptr : h.scratch + pick::kScratchPerPick * i * h.fanout;
      pick::pick_positions(pick::target_key(seed, h.hop, i, node, h.node_keyed), b, degree, h.fanout, h.replace, k,
                           h.padded_pos + i * h.fanout, scratch);
    }
  }
  h.picks[i] = k;
}

__global__ void lean_insert_kernel(LeanHop h, Topology g, NodeTable table, LeanTotals totals, int64_t* edge_pos,
                                   int64_t* col, long long* status) {
  const int64_t p = global_id();
  const int64_t i = p / h.fanout;
  if (i >= h.max_targets) return;
  const int64_t j = p - i * h.fanout;
  const int64_t k = h.picks[i];
  if (j >= k) return;
  const int64_t e = h.incl_picks[i] - k + j;
  if (e >= h.max_edges) {  // only an invalid indptr (overlapping neighborhoods) gets here
    report(status, kSampleBoundExceeded, h.hop, e + 1, h.max_edges);
    return;
  }
  const int64_t out = static_cast<int64_t>(totals.edges[h.hop]) + e;
  const int64_t pos = h.padded_pos[p];
  edge_pos[out] = pos;
  col[out] = frontier_begin(totals, h.hop) + i;
  const int64_t node = load_index(g.indices, g.indices_int64, pos);
  h.nbr[e] = node;
  if (node < 0 || node >= g.num_nodes) {
    report(status, kSampleBadNeighbor, pos, node, 0);
    h.slot[e] = -1;
    return;
  }
  bool inserted = false;
  const int64_t s = table_insert(table, node + h.key_offset, &inserted);
  h.slot[e] = s;
  if (__ldcg(table.values + s) < 0) {
    atomicMin(reinterpret_cast<unsigned long long*>(table.first + s), static_cast<unsigned long long>(e));
  }
}

__global__ void lean_flag_kernel(LeanHop h, NodeTable table) {
  const int64_t e = global_id();
  if (e >= h.max_edges) return;
  if (e >= hop_edges(h)) {
    h.flags[e] = 0;  // zero beyond the hop's edges, so the prefix sum over the bound ends at the new-node count
    return;
  }
  const int64_t s = h.slot[e];
  h.flags[e] = (s >= 0 && table.values[s] < 0 && table.first[s] == e) ? 1 : 0;
}

__global__ void lean_finalize_kernel(LeanHop h, NodeTable table, LeanTotals totals, int64_t* row, int64_t* n_id,
                                     long long* status) {
  const int64_t e = global_id();
  const int64_t n_before = static_cast<int64_t>(totals.nodes[h.hop]);
  const int64_t base = static_cast<int64_t>(totals.edges[h.hop]);
  const int64_t num_edges = hop_edges(h);
  if (e == 0) {
    totals.nodes[h.hop + 1] = n_before + (h.max_edges > 0 ? h.incl_flags[h.max_edges - 1] : 0);
    totals.edges[h.hop + 1] = base + num_edges;
  }
  if (e >= num_edges) return;
  const int64_t s = h.slot[e];
  if (s < 0) {
    row[base + e] = -1;  // a bad neighbor id: the call raises
    return;
  }
  const long long v = __ldcg(table.values + s);
  if (v >= 0) {  // known before this hop, or already numbered by its first edge (same value either way)
    row[base + e] = v;
    return;
  }
  const long long f = table.first[s];
  const int64_t local = n_before + h.incl_flags[f] - 1;
  row[base + e] = local;
  if (f == e && local >= h.max_nodes) {  // bad or repeated seeds took n_id entries the bound counts as nodes
    report(status, kSampleBoundExceeded, h.hop, local + 1, h.max_nodes);
    return;
  }
  if (f == e) {
    n_id[local] = h.nbr[e];
    table.values[s] = local;
  }
}

}  // namespace

cudaError_t launch_lean_inputs(const int64_t* seeds, int64_t n, int64_t rng_seed, LeanInputs inputs,
                               cudaStream_t stream) {
  lean_inputs_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(seeds, n, rng_seed, inputs.data);
  return cudaGetLastError();
}

cudaError_t launch_lean_seeds(LeanInputs inputs, int64_t num_nodes, NodeTable table, int64_t* n_id,
                              long long* status, LeanTotals totals, cudaStream_t stream) {
  lean_seeds_kernel<<<blocks_for(inputs.num_seeds, kThreads), kThreads, 0, stream>>>(inputs, num_nodes, table, n_id,
                                                                                      status, totals);
  return cudaGetLastError();
}

cudaError_t launch_lean_count_pick(const LeanHop& hop, const int64_t* n_id, Topology graph, LeanTotals totals,
                                   long long* status, cudaStream_t stream) {
  lean_count_pick_kernel<<<blocks_for(hop.max_targets, kPickThreads), kPickThreads, 0, stream>>>(hop, n_id, graph,
                                                                                                 totals, status);
  return cudaGetLastError();
}

cudaError_t launch_lean_insert(const LeanHop& hop, Topology graph, NodeTable table, LeanTotals totals,
                               int64_t* edge_pos, int64_t* col, long long* status, cudaStream_t stream) {
  lean_insert_kernel<<<blocks_for(hop.max_targets * hop.fanout, kThreads), kThreads, 0, stream>>>(
      hop, graph, table, totals, edge_pos, col, status);
  return cudaGetLastError();
}

cudaError_t launch_lean_flag(const LeanHop& hop, NodeTable table, cudaStream_t stream) {
  lean_flag_kernel<<<blocks_for(hop.max_edges, kThreads), kThreads, 0, stream>>>(hop, table);
  return cudaGetLastError();
}

cudaError_t launch_lean_finalize(const LeanHop& hop, NodeTable table, LeanTotals totals, int64_t* row,
                                 int64_t* n_id, long long* status, cudaStream_t stream) {
  lean_finalize_kernel<<<blocks_for(hop.max_edges, kThreads), kThreads, 0, stream>>>(hop, table, totals, row,
                                                                                      n_id, status);
  return cudaGetLastError();
}

}  // namespace zerocopy::cuda
