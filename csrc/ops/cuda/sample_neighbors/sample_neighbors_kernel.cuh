// Raw-pointer CUDA kernels of `zerocopy::sample_neighbors` (multi-hop uniform sampling over incoming/CSC
// edges, with the topology in GPU memory or read from registered host memory through UVA).
//
// No torch headers: these compile with plain `nvcc -c`. The torch glue (allocation from PyTorch's caching
// allocator, prefix sums, read-backs, error messages) is csrc/ops/cuda/sample_neighbors_cuda.cpp.
//
// Per hop, with the frontier n_id[t0, t0 + T):
//   1. launch_count_picks   per target: neighborhood start, degree, number of picks (validates indptr)
//   2. (glue)               offsets = exclusive prefix sum of the picks, E = offsets[T]
//   3. launch_pick_edges    per target: the picked edge positions, drawn by the pick policy the CPU kernel
//                           uses (ops/pick_policy.h)
//   4. launch_insert_edges  per edge: neighbor id (validated), inserted into the batch's hash table (global id
//                           -> local id); a node new in this hop records the smallest edge index it occurs at
//   5. launch_flag_first    per edge: 1 where the edge is its node's first appearance in this hop
//   6. (glue)               inclusive prefix sum of the flags -> local ids of the new nodes, in order of first
//                           appearance (the CPU op's order, bitwise)
//   7. launch_finalize      per edge: row (local id of the neighbor); first appearances append to n_id
//
// Node-keyed sampling (evaluation) keys a target's picks by its node id (pick::target_key) and a neighbor's table
// entry by (level, node): key = node + (hop + 1) * num_nodes for the neighbors of hop `hop` (seeds: the node), so
// a node already at a lower level is new again at the next one (nodes deduplicated per hop, as on the CPU).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace zerocopy::cuda {

// Error slot layout: status[0] = code (0 = fine), status[1..3] = details. The first error wins.
enum SampleErrorCode : int64_t {
  kSampleOk = 0,
  kSampleBadSeed = 1,        // [1] = position in seeds, [2] = value
  kSampleDuplicateSeed = 2,  // [1] = position in seeds, [2] = node
  kSampleBadIndptr = 3,      // [1] = node, [2] = indptr[node], [3] = indptr[node + 1]
  kSampleBadNeighbor = 4,    // [1] = position in indices, [2] = value
  kSampleBoundExceeded = 5,  // [1] = hop, [2] = count, [3] = bound (only with an invalid indptr)
};
inline constexpr int kSampleStatusSlots = 4;

// Open-addressing table (linear probing) from global node id to local id, one per batch. `capacity` is a
// power of two. Empty: keys = -1, values = -1, first = kNoFirst (all-0x7F bytes, so one memset sets it).
struct NodeTable {
  long long* keys = nullptr;
  long long* values = nullptr;  // local id once assigned, else -1
  long long* first = nullptr;   // smallest edge index (within the current hop) where a new node occurs
  int64_t capacity = 0;
};
inline constexpr long long kNoFirst = 0x7F7F7F7F7F7F7F7FLL;

// Where a target's picks are drawn from. indices_int64 selects the element type of `indices`.
struct Topology {
  const int64_t* indptr = nullptr;  // num_nodes + 1 entries, device-accessible (GPU memory or mapped host)
  const void* indices = nullptr;    // num_edges entries, device-accessible
  bool indices_int64 = false;
  int64_t num_nodes = 0;
  int64_t num_edges = 0;
};

// n_id[i] = seeds[i] and table[seeds[i]] = i for i < n; validates ids and uniqueness into `status`.
cudaError_t launch_insert_seeds(const int64_t* seeds, int64_t n, int64_t num_nodes, NodeTable table,
                                int64_t* n_id, long long* status, cudaStream_t stream);

// For the frontier n_id[t0, t0 + count): starts[i], degrees[i] and picks[i] (number of edges to draw).
cudaError_t launch_count_picks(const int64_t* n_id, int64_t t0, int64_t count, Topology graph, int64_t fanout,
                               bool replace, int64_t* starts, int64_t* degrees, int64_t* picks,
                               long long* status, cudaStream_t stream);

// Per target i (node n_id[t0 + i]): writes edge_pos[offsets[i] + j] and col[offsets[i] + j] = t0 + i for its
// picks j, keyed by position or, with node_keyed, by node id. `scratch` (pick::kScratchPerPick * E int64) is
// needed only without replacement when fanout > pick::kFloydMaxPicks; else nullptr.
cudaError_t launch_pick_edges(int64_t count, const int64_t* n_id, const int64_t* starts, const int64_t* degrees,
                              const int64_t* offsets, int64_t fanout, bool replace, uint64_t seed, int64_t hop,
                              bool node_keyed, int64_t t0, int64_t* edge_pos, int64_t* col, int64_t* scratch,
                              cudaStream_t stream);

// Per edge e < num_edges: nbr[e] = indices[edge_pos[e]] (validated), slot[e] = the table slot of key
// nbr[e] + key_offset (-1 if bad); key_offset is 0, or (hop + 1) * num_nodes when node-keyed.
cudaError_t launch_insert_edges(int64_t num_edges, const int64_t* edge_pos, Topology graph, NodeTable table,
                                int64_t key_offset, int64_t* nbr, int64_t* slot, long long* status,
                                cudaStream_t stream);

// flags[e] = 1 if edge e is the first occurrence in this hop of a node not yet in n_id, else 0.
cudaError_t launch_flag_first(int64_t num_edges, const int64_t* slot, NodeTable table, int32_t* flags,
                              cudaStream_t stream);

// row[e] = local id of nbr[e]; with incl = inclusive prefix sum of the flags, a new node's local id is
// n_before + incl[first] - 1, and its first edge writes n_id[local] = nbr[e] and records it in the table.
cudaError_t launch_finalize(int64_t num_edges, const int64_t* nbr, const int64_t* slot, const int64_t* incl,
                            int64_t n_before, NodeTable table, int64_t* row, int64_t* n_id, cudaStream_t stream);

}  // namespace zerocopy::cuda
