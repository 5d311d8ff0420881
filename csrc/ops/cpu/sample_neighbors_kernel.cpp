// CPU kernel of `zerocopy::sample_neighbors`: multi-hop uniform neighbor sampling over incoming (CSC) edges.
//
// Per hop: (1) count each frontier target's picks in parallel, (2) prefix-sum them into edge offsets,
// (3) draw and write each target's picks in parallel with the pick policy shared with the CUDA kernel
// (ops/pick_policy.h), every target with its own counter-based random stream keyed by (seed, hop, position in
// the frontier), so the result is independent of the thread count,
// (4) relabel the sampled neighbors to local ids in edge order through a dense global -> local array, so n_id
// lists new nodes in order of first appearance as PyG does (sequentially, or for large hops on several
// threads in parallel passes that give the same result).
//
// Node-keyed sampling (`node_keyed`, for evaluation) keys each target's stream by (seed, hop, node id) instead of
// its position, and deduplicates nodes per hop only: hop k's neighbors become level k + 1 of n_id even when they
// already sit at a lower level (a node may then appear at several levels, and edges only run from level k + 1 to
// level k). A node's picks at a hop, and so everything a GNN computes for a seed, then do not depend on which
// other seeds share its batch.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <numeric>
#include <tuple>
#include <utility>
#include <vector>

#include "ops/checks.h"
#include "ops/pick_policy.h"
#include "ops/sample_neighbors.h"

namespace zerocopy {
namespace {

using Ids = std::vector<int64_t>;

// Frontier targets per parallel task: enough work to amortise scheduling, small enough to balance.
constexpr int64_t kGrainTargets = 64;
// How far ahead the loops prefetch the random reads (indptr per target, indices per target, map per edge):
// sampling is bound by cache misses, and a sequential loop otherwise waits for one miss at a time.
constexpr int64_t kPrefetchTargets = 8;
constexpr int64_t kPrefetchEdges = 16;

// Relabeling is sequential (one pass, one map access per edge) unless the hop has this many edges and
// at least this many threads run: the parallel relabel makes ~3 map accesses per edge, so it only pays off
// with several threads.
constexpr int64_t kParallelRelabelMinEdges = 1 << 15;
constexpr int kParallelRelabelMinThreads = 4;
// Edges per block of the parallel relabel's counting passes.
constexpr int64_t kRelabelBlock = 1 << 12;

inline void prefetch(const void* address) { __builtin_prefetch(address, 0, 1); }

// The dense global -> local id map of the calling thread: num_nodes entries, all -1 between calls. It grows
// with the largest graph seen and is never cleared wholesale; LocalIds restores only the entries it set.
Ids& thread_local_map(int64_t num_nodes) {
  thread_local Ids map;
  if (static_cast<int64_t>(map.size()) < num_nodes) map.resize(num_nodes, -1);  // -1 = LocalIds::kEmpty
  return map;
}

// n_id of one batch plus the map from global to local ids. The destructor resets the map entries it touched,
// also when a check throws halfway through a batch.
class LocalIds {
 public:
  explicit LocalIds(int64_t num_nodes) : map_(thread_local_map(num_nodes).data()) {}
  LocalIds(const LocalIds&) = delete;
  LocalIds& operator=(const LocalIds&) = delete;
  ~LocalIds() { clear_map(); }

  // Forgets the map entries of n_id[begin, end) (their local ids stay in n_id): later relabels give those nodes
  // new local ids. Node-keyed sampling forgets each level before numbering the next one.
  void forget(int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) map_[n_id_[k]] = kEmpty;
  }

  // Adds `node` (which must be in range) and returns true, or returns false if it is already present.
  bool insert(int64_t node) {
    if (map_[node] != kEmpty) return false;
    map_[node] = static_cast<int64_t>(n_id_.size());
    n_id_.push_back(node);
    return true;
  }

  // Replaces the global ids row[0, count) (all in range) by local ids, appending the new nodes to n_id in
  // order of first appearance. Both paths give the same result.
  void relabel(int64_t* row, int64_t count) {
    if (count >= kParallelRelabelMinEdges && at::get_num_threads() >= kParallelRelabelMinThreads) {
      relabel_parallel(row, count);
    } else {
      relabel_sequential(row, count);
    }
  }

  void relabel_sequential(int64_t* row, int64_t count) {
    n_id_.reserve(n_id_.size() + count);
    for (int64_t k = 0; k < count; ++k) {
      if (k + kPrefetchEdges < count) __builtin_prefetch(map_ + row[k + kPrefetchEdges], 1, 1);
      int64_t& local = map_[row[k]];
      if (local < 0) {
        local = static_cast<int64_t>(n_id_.size());
        n_id_.push_back(row[k]);
      }
      row[k] = local;
    }
  }

  // Four parallel passes: (a) every edge claims its node's map entry, the earliest edge winning (a claim
  // is stored as claim_code(edge) <= -2, below kEmpty = -1 and the local ids >= 0, which it never
  // replaces); (b) per block, count the edges that won their claim: the first appearances of new nodes;
  // (c) give those nodes consecutive local ids in edge order (a block's offset is the prefix sum of the
  // counts); (d) read every edge's local id.
  void relabel_parallel(int64_t* row, int64_t count) {
    at::parallel_for(0, count, kRelabelBlock, [&](int64_t lo, int64_t hi) {
      for (int64_t k = lo; k < hi; ++k) claim(row[k], k);
    });
    const int64_t num_blocks = (count + kRelabelBlock - 1) / kRelabelBlock;
    std::vector<uint8_t> first(count);
    Ids block_offsets(num_blocks + 1, 0);
    at::parallel_for(0, num_blocks, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t block = lo; block < hi; ++block) {
        const int64_t end = std::min(count, (block + 1) * kRelabelBlock);
        int64_t found = 0;
        for (int64_t k = block * kRelabelBlock; k < end; ++k) {
          first[k] = map_[row[k]] == claim_code(k);
          found += first[k];
        }
        block_offsets[block + 1] = found;
      }
    });
    std::partial_sum(block_offsets.begin(), block_offsets.end(), block_offsets.begin());
    const int64_t base = size();
    n_id_.resize(base + block_offsets[num_blocks]);
    at::parallel_for(0, num_blocks, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t block = lo; block < hi; ++block) {
        const int64_t end = std::min(count, (block + 1) * kRelabelBlock);
        int64_t local = base + block_offsets[block];
        for (int64_t k = block * kRelabelBlock; k < end; ++k) {
          if (!first[k]) continue;
          map_[row[k]] = local;
          n_id_[local++] = row[k];
        }
      }
    });
    at::parallel_for(0, count, kRelabelBlock, [&](int64_t lo, int64_t hi) {
      for (int64_t k = lo; k < hi; ++k) {
        if (k + kPrefetchEdges < hi) __builtin_prefetch(map_ + row[k + kPrefetchEdges], 0, 1);
        row[k] = map_[row[k]];
      }
    });
  }

  int64_t size() const { return static_cast<int64_t>(n_id_.size()); }
  const int64_t* data() const { return n_id_.data(); }
  void reserve(int64_t n) { n_id_.reserve(n); }
  // Hands over n_id, leaving the map all -1 again for the next batch of this thread.
  Ids release() {
    clear_map();
    return std::exchange(n_id_, Ids());
  }

 private:
  static constexpr int64_t kEmpty = -1;
  static int64_t claim_code(int64_t edge) { return -2 - edge; }

  // Lowers map_[node] to the claim of `edge` unless it holds a local id or an earlier edge's claim.
  void claim(int64_t node, int64_t edge) {
    std::atomic_ref<int64_t> entry(map_[node]);
    const int64_t desired = claim_code(edge);
    int64_t current = entry.load(std::memory_order_relaxed);
    while ((current == kEmpty || (current < 0 && current < desired)) &&
           !entry.compare_exchange_weak(current, desired, std::memory_order_relaxed)) {
    }
  }

  void clear_map() {
    for (int64_t node : n_id_) map_[node] = kEmpty;
  }

  int64_t* map_;
  Ids n_id_;
};

template <typename index_t>
struct CscView {
  const int64_t* indptr;
  const index_t* indices;
  int64_t num_nodes;
  int64_t num_edges;

  // Start of the incoming edges of `node` and their count, checking the pointer entries read.
  std::pair<int64_t, int64_t> neighborhood(int64_t node) const {
    const int64_t begin = indptr[node];
    const int64_t end = indptr[node + 1];
    TORCH_CHECK_VALUE(0 <= begin && begin <= end && end <= num_edges, kSampleNeighbors,
                      ": `indptr` is not a valid CSC pointer at node ", node, " (indptr[", node, "] = ", begin,
                      ", indptr[", node + 1, "] = ", end, ", indices has ", num_edges,
                      " entries); it must be non-decreasing from 0 to indices.numel()");
    return {begin, end - begin};
  }

  // The neighbor id stored at edge `position`, checked to be a node id.
  int64_t neighbor(int64_t position) const {
    const int64_t node = static_cast<int64_t>(indices[position]);
    TORCH_CHECK_INDEX(0 <= node && node < num_nodes, kSampleNeighbors, ": `indices[", position, "]` = ", node,
                      " is not a node id in [0, ", num_nodes, ")");
    return node;
  }
};

// Scratch memory of the calling thread for pick::pick_positions (grows, never shrinks).
int64_t* thread_scratch(int64_t slots) {
  thread_local Ids scratch;
  if (static_cast<int64_t>(scratch.size()) < slots) scratch.resize(slots);
  return scratch.data();
}

// The edges sampled so far, in output order (hop, then target, then pick).
struct Edges {
  Ids row;  // global neighbor id until relabeled, then its local id
  Ids col;  // local id of the target
  Ids pos;  // position of the edge in `indices`

  int64_t size() const { return static_cast<int64_t>(pos.size()); }
  void grow(int64_t n) {
    row.resize(n);
    col.resize(n);
    pos.resize(n);
  }
};

// One hop: expands the frontier n_id[frontier_begin, frontier_end), appending its edges to `edges` and its
// new nodes to `ids` (node-keyed: every neighbor not yet in this hop's level). Returns the number of edges added.
template <typename index_t>
int64_t sample_hop(const CscView<index_t>& graph, int64_t frontier_begin, int64_t frontier_end, int64_t fanout,
                   bool replace, uint64_t seed, int64_t hop, bool node_keyed, LocalIds& ids, Edges& edges) {
  const int64_t frontier_size = frontier_end - frontier_begin;
  const int64_t* frontier = ids.data() + frontier_begin;

  // (1) Neighborhood start and pick count per target.
  Ids starts(frontier_size);
  Ids degrees(frontier_size);
  Ids offsets(frontier_size + 1, 0);
  at::parallel_for(0, frontier_size, kGrainTargets, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      if (i + kPrefetchTargets < hi) prefetch(graph.indptr + frontier[i + kPrefetchTargets]);
      const auto [begin, degree] = graph.neighborhood(frontier[i]);
      starts[i] = begin;
      degrees[i] = degree;
      offsets[i + 1] = pick::num_picks(degree, fanout, replace);
    }
  });

  // (2) Edge offsets.
  std::partial_sum(offsets.begin(), offsets.end(), offsets.begin());
  const int64_t base = edges.size();
  const int64_t added = offsets[frontier_size];
  edges.grow(base + added);

  // (3) Picks, each target from its own stream; neighbor ids range-checked before anything indexes by them.
  int64_t* row = edges.row.data() + base;
  int64_t* col = edges.col.data() + base;
  int64_t* pos = edges.pos.data() + base;
  at::parallel_for(0, frontier_size, kGrainTargets, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t first = offsets[i];
      const int64_t count = offsets[i + 1] - first;
      if (count == 0) continue;
      if (i + kPrefetchTargets < hi) prefetch(graph.indices + starts[i + kPrefetchTargets]);
      pick::pick_positions(pick::target_key(seed, hop, i, frontier[i], node_keyed), starts[i], degrees[i], fanout,
                           replace, count, pos + first, thread_scratch(pick::scratch_slots(count, replace)));
      for (int64_t k = first; k < first + count; ++k) {
        row[k] = graph.neighbor(pos[k]);
        col[k] = frontier_begin + i;
      }
    }
  });

  // (4) Relabel in edge order: new nodes enter n_id in order of first appearance. Node-keyed, the map holds only
  // the frontier's level (the ones below were forgotten by earlier hops): forget it, so the next level is new.
  if (node_keyed) ids.forget(frontier_begin, frontier_end);
  ids.relabel(row, added);
  return added;
}

// Hands a vector to a tensor without copying; the tensor's deleter frees it.
at::Tensor to_tensor(Ids&& values) {
  const auto n = static_cast<int64_t>(values.size());
  if (n == 0) return at::empty({0}, at::kLong);
  auto* owned = new Ids(std::move(values));
  return at::from_blob(owned->data(), {n}, [owned](void*) { delete owned; }, at::TensorOptions(at::kLong));
}

at::Tensor counts_tensor(const Ids& counts) {
  at::Tensor out = at::empty({static_cast<int64_t>(counts.size())}, at::kLong);
  std::copy(counts.begin(), counts.end(), out.data_ptr<int64_t>());
  return out;
}

using Sample = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

template <typename index_t>
Sample sample(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& seeds,
              c10::IntArrayRef fanouts, bool replace, int64_t seed, bool node_keyed) {
  const CscView<index_t> graph{indptr.data_ptr<int64_t>(), indices.data_ptr<index_t>(), indptr.numel() - 1,
                               indices.numel()};
  LocalIds ids(graph.num_nodes);
  const int64_t num_seeds = seeds.numel();
  const int64_t* seed_ids = seeds.data_ptr<int64_t>();
  ids.reserve(num_seeds);
  for (int64_t i = 0; i < num_seeds; ++i) {
    const int64_t node = seed_ids[i];
    TORCH_CHECK_INDEX(0 <= node && node < graph.num_nodes, kSampleNeighbors, ": `seeds[", i, "]` = ", node,
                      " is not a node id in [0, ", graph.num_nodes, ")");
    TORCH_CHECK_VALUE(ids.insert(node), kSampleNeighbors, ": `seeds` must be unique, but node ", node,
                      " appears again at seeds[", i, "]");
  }

  Edges edges;
  Ids num_sampled_nodes{num_seeds};
  Ids num_sampled_edges;
  int64_t frontier_begin = 0;
  for (size_t hop = 0; hop < fanouts.size(); ++hop) {
    const int64_t frontier_end = ids.size();
    num_sampled_edges.push_back(sample_hop(graph, frontier_begin, frontier_end, fanouts[hop], replace,
                                           static_cast<uint64_t>(seed), static_cast<int64_t>(hop), node_keyed, ids,
                                           edges));
    num_sampled_nodes.push_back(ids.size() - frontier_end);
    frontier_begin = frontier_end;
  }
  return {to_tensor(ids.release()),         to_tensor(std::move(edges.row)),
          to_tensor(std::move(edges.col)),  to_tensor(std::move(edges.pos)),
          counts_tensor(num_sampled_nodes), counts_tensor(num_sampled_edges)};
}

Sample sample_neighbors_cpu(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& seeds,
                            c10::IntArrayRef fanouts, bool replace, int64_t seed, bool node_keyed) {
  check_sample_neighbors_args(indptr, indices, seeds, fanouts);
  check_cpu(indptr, kSampleNeighbors, "indptr");
  return AT_DISPATCH_INDEX_TYPES(indices.scalar_type(), "sample_neighbors_cpu", [&] {
    return sample<index_t>(indptr, indices, seeds, fanouts, replace, seed, node_keyed);
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(zerocopy, CPU, m) { m.impl("sample_neighbors", &sample_neighbors_cpu); }

}  // namespace zerocopy
