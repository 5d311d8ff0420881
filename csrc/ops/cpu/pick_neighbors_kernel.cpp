// CPU kernel of `zerocopy::pick_neighbors`: one hop of `sample_neighbors` without its deduplication and relabeling.
//
// Per target (in parallel): its pick count, then (after a prefix sum) its picks, drawn by the pick policy shared
// with the CUDA kernel (ops/pick_policy.h) from the stream `sample_neighbors` gives hop 0 (pick::target_key with
// hop 0, position or node id), so the picks are bitwise those of `sample_neighbors(..., fanouts=[fanout])`; each
// edge's neighbor id is read (range-checked) and returned as is, with the target's position. No global -> local
// map: nothing proportional to the graph's node count is allocated.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cstdint>
#include <tuple>
#include <vector>

#include "ops/checks.h"
#include "ops/pick_neighbors.h"
#include "ops/pick_policy.h"

namespace zerocopy {
namespace {

constexpr int64_t kGrainTargets = 64;

// Scratch memory of the calling thread for pick::pick_positions (grows, never shrinks).
int64_t* thread_scratch(int64_t slots) {
  thread_local std::vector<int64_t> scratch;
  if (static_cast<int64_t>(scratch.size()) < slots) scratch.resize(slots);
  return scratch.data();
}

template <typename index_t>
PickedEdges pick(const at::Tensor& indptr_t, const at::Tensor& indices_t, const at::Tensor& targets_t, int64_t fanout,
                 bool replace, int64_t seed, bool node_keyed, c10::IntArrayRef target_ends) {
  const int64_t* indptr = indptr_t.data_ptr<int64_t>();
  const index_t* indices = indices_t.data_ptr<index_t>();
  const int64_t* targets = targets_t.data_ptr<int64_t>();
  const int64_t num_nodes = indptr_t.numel() - 1;
  const int64_t num_edges = indices_t.numel();
  const int64_t count = targets_t.numel();
  for (int64_t i = 0; i < count; ++i) {
    TORCH_CHECK_INDEX(0 <= targets[i] && targets[i] < num_nodes, kPickNeighbors, ": `targets[", i, "]` = ",
                      targets[i], " is not a node id in [0, ", num_nodes, ")");
  }
  std::vector<int64_t> starts(count), degrees(count), offsets(count + 1, 0);
  at::parallel_for(0, count, kGrainTargets, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t node = targets[i];
      const int64_t begin = indptr[node];
      const int64_t end = indptr[node + 1];
      TORCH_CHECK_VALUE(0 <= begin && begin <= end && end <= num_edges, kPickNeighbors,
                        ": `indptr` is not a valid CSC pointer at node ", node, " (indptr[", node, "] = ", begin,
                        ", indptr[", node + 1, "] = ", end, ", indices has ", num_edges,
                        " entries); it must be non-decreasing from 0 to indices.numel()");
      starts[i] = begin;
      degrees[i] = end - begin;
      offsets[i + 1] = pick::num_picks(end - begin, fanout, replace);
    }
  });
  for (int64_t i = 0; i < count; ++i) offsets[i + 1] += offsets[i];
  const int64_t total = offsets[count];
  at::Tensor nbr = at::empty({total}, at::kLong);
  at::Tensor col = at::empty({total}, at::kLong);
  at::Tensor pos = at::empty({total}, at::kLong);
  int64_t* nbr_p = nbr.data_ptr<int64_t>();
  int64_t* col_p = col.data_ptr<int64_t>();
  int64_t* pos_p = pos.data_ptr<int64_t>();
  at::parallel_for(0, count, kGrainTargets, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t first = offsets[i];
      const int64_t k = offsets[i + 1] - first;
      if (k == 0) continue;
      pick::pick_positions(pick::target_key(static_cast<uint64_t>(seed), 0, i, targets[i], node_keyed), starts[i],
                           degrees[i], fanout, replace, k, pos_p + first,
                           thread_scratch(pick::scratch_slots(k, replace)));
      for (int64_t e = first; e < first + k; ++e) {
        const auto node = static_cast<int64_t>(indices[pos_p[e]]);
        TORCH_CHECK_INDEX(0 <= node && node < num_nodes, kPickNeighbors, ": `indices[", pos_p[e], "]` = ", node,
                          " is not a node id in [0, ", num_nodes, ")");
        nbr_p[e] = node;
        col_p[e] = i;
      }
    }
  });
  at::Tensor edge_ends = at::empty({static_cast<int64_t>(target_ends.size())}, at::kLong);
  for (size_t s = 0; s < target_ends.size(); ++s) edge_ends.data_ptr<int64_t>()[s] = offsets[target_ends[s]];
  return {nbr, col, pos, edge_ends};
}

PickedEdges pick_neighbors_cpu(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& targets,
                               int64_t fanout, bool replace, int64_t seed, bool node_keyed,
                               c10::IntArrayRef target_ends) {
  check_pick_neighbors_args(indptr, indices, targets, fanout, target_ends);
  check_cpu(indptr, kPickNeighbors, "indptr");
  check_cpu(indices, kPickNeighbors, "indices");
  check_cpu(targets, kPickNeighbors, "targets");
  return AT_DISPATCH_INDEX_TYPES(indices.scalar_type(), "pick_neighbors_cpu", [&] {
    return pick<index_t>(indptr, indices, targets, fanout, replace, seed, node_keyed, target_ends);
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(zerocopy, CPU, m) { m.impl("pick_neighbors", &pick_neighbors_cpu); }

}  // namespace zerocopy
