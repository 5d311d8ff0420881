// CPU kernel of `zerocopy::build_csc`: COO (src, dst) -> CSC over dst.
//
// 1. count incoming edges per target (atomic histogram, parallel over edges), skipping self-loops if asked;
// 2. exclusive prefix sum -> segment starts in `indptr`;
// 3. scatter every edge position into its target's segment (atomic cursors kept in `indptr` itself, so no
//    extra N-sized array), then shift `indptr` back;
// 4. per target, sort its edges by (source, input position) in thread-local scratch (parallel over chunks of
//    targets holding about equal numbers of edges) and write `indices`; sorting on the input position too
//    makes the result deterministic and stable (ties keep input order) despite the racy scatter;
// 5. with duplicate removal, each sorted segment keeps the first of each run of equal sources, and a final
//    parallel pass compacts the segments into right-sized outputs.
// Peak extra memory beyond the outputs: one scratch vector per thread, sized by the largest in-degree
// (plus the compacted copies when duplicates were actually removed).
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

#include "ops/build_csc.h"

namespace zerocopy {
namespace {

constexpr int64_t kEdgeGrain = 1 << 15;

// Splits targets [0, num_nodes) into chunks of about equal edge counts, for load balance on skewed degrees.
std::vector<int64_t> balanced_node_chunks(const int64_t* indptr, int64_t num_nodes) {
  const int64_t num_edges = indptr[num_nodes];
  const int64_t num_chunks =
      std::max<int64_t>(1, std::min<int64_t>(num_nodes, static_cast<int64_t>(at::get_num_threads()) * 16));
  std::vector<int64_t> bounds(num_chunks + 1);
  bounds[0] = 0;
  for (int64_t c = 1; c < num_chunks; ++c) {
    const int64_t target_edges = num_edges / num_chunks * c;
    const int64_t v = std::lower_bound(indptr, indptr + num_nodes + 1, target_edges) - indptr;
    bounds[c] = std::clamp<int64_t>(v, bounds[c - 1], num_nodes);
  }
  bounds[num_chunks] = num_nodes;
  return bounds;
}

template <typename index_t>
std::tuple<at::Tensor, at::Tensor, at::Tensor> build_csc_impl(const at::Tensor& src_t, const at::Tensor& dst_t,
                                                              int64_t num_nodes, bool remove_self_loops,
                                                              bool remove_duplicates) {
  const int64_t num_input = src_t.numel();
  const int64_t* src = src_t.const_data_ptr<int64_t>();
  const int64_t* dst = dst_t.const_data_ptr<int64_t>();
  const auto long_opts = src_t.options().dtype(at::kLong);

  // 1. in-degree histogram, shifted by one so that the prefix sum yields segment starts.
  at::Tensor indptr_t = at::zeros({num_nodes + 1}, long_opts);
  int64_t* indptr = indptr_t.data_ptr<int64_t>();
  at::parallel_for(0, num_input, kEdgeGrain, [&](int64_t begin, int64_t end) {
    for (int64_t e = begin; e < end; ++e) {
      if (remove_self_loops && src[e] == dst[e]) continue;
      std::atomic_ref<int64_t>(indptr[dst[e] + 1]).fetch_add(1, std::memory_order_relaxed);
    }
  });
  // 2. prefix sum: indptr[v] = start of v's segment.
  for (int64_t v = 0; v < num_nodes; ++v) indptr[v + 1] += indptr[v];
  const int64_t num_edges = indptr[num_nodes];

  // 3. scatter edge positions, using indptr[v] as v's cursor; afterwards indptr[v] = end of v = start of v+1.
  at::Tensor perm_t = at::empty({num_edges}, long_opts);
  int64_t* perm = perm_t.data_ptr<int64_t>();
  at::parallel_for(0, num_input, kEdgeGrain, [&](int64_t begin, int64_t end) {
    for (int64_t e = begin; e < end; ++e) {
      if (remove_self_loops && src[e] == dst[e]) continue;
      const int64_t pos = std::atomic_ref<int64_t>(indptr[dst[e]]).fetch_add(1, std::memory_order_relaxed);
      perm[pos] = e;
    }
  });
  for (int64_t v = num_nodes; v > 0; --v) indptr[v] = indptr[v - 1];
  indptr[0] = 0;

  // 4. sort each segment by (source, input position); optionally drop repeated sources.
  at::Tensor indices_t = at::empty({num_edges}, src_t.options().dtype(c10::CppTypeToScalarType<index_t>::value));
  index_t* indices = indices_t.data_ptr<index_t>();
  // With duplicate removal, kept[v + 1] = number of edges v keeps (becomes the compacted indptr).
  at::Tensor kept_t = remove_duplicates ? at::zeros({num_nodes + 1}, long_opts) : at::Tensor();
  int64_t* kept = remove_duplicates ? kept_t.data_ptr<int64_t>() : nullptr;
  const std::vector<int64_t> chunks = balanced_node_chunks(indptr, num_nodes);
  at::parallel_for(0, static_cast<int64_t>(chunks.size()) - 1, 1, [&](int64_t cbegin, int64_t cend) {
    std::vector<std::pair<int64_t, int64_t>> scratch;  // (source, input position)
    for (int64_t v = chunks[cbegin]; v < chunks[cend]; ++v) {
      const int64_t b = indptr[v];
      const int64_t degree = indptr[v + 1] - b;
      if (degree == 1) {
        indices[b] = static_cast<index_t>(src[perm[b]]);
        if (kept) kept[v + 1] = 1;
        continue;
      }
      scratch.resize(degree);
      for (int64_t k = 0; k < degree; ++k) scratch[k] = {src[perm[b + k]], perm[b + k]};
      std::sort(scratch.begin(), scratch.end());
      int64_t out = 0;
      for (int64_t k = 0; k < degree; ++k) {
        if (remove_duplicates && out > 0 && scratch[k].first == scratch[k - 1].first) continue;
        indices[b + out] = static_cast<index_t>(scratch[k].first);
        perm[b + out] = scratch[k].second;
        ++out;
      }
      if (kept) kept[v + 1] = out;
    }
  });
  if (!remove_duplicates) return {indptr_t, indices_t, perm_t};

  // 5. compact: each segment's kept prefix moves to its new offset.
  for (int64_t v = 0; v < num_nodes; ++v) kept[v + 1] += kept[v];
  const int64_t num_kept = kept[num_nodes];
  if (num_kept == num_edges) return {indptr_t, indices_t, perm_t};
  at::Tensor new_indices_t = at::empty({num_kept}, indices_t.options());
  at::Tensor new_perm_t = at::empty({num_kept}, long_opts);
  index_t* new_indices = new_indices_t.data_ptr<index_t>();
  int64_t* new_perm = new_perm_t.data_ptr<int64_t>();
  const std::vector<int64_t> kept_chunks = balanced_node_chunks(kept, num_nodes);
  at::parallel_for(0, static_cast<int64_t>(kept_chunks.size()) - 1, 1, [&](int64_t cbegin, int64_t cend) {
    for (int64_t v = kept_chunks[cbegin]; v < kept_chunks[cend]; ++v) {
      const int64_t from = indptr[v];
      const int64_t to = kept[v];
      const int64_t count = kept[v + 1] - to;
      std::copy_n(indices + from, count, new_indices + to);
      std::copy_n(perm + from, count, new_perm + to);
    }
  });
  return {kept_t, new_indices_t, new_perm_t};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> build_csc_cpu(const at::Tensor& src, const at::Tensor& dst,
                                                             int64_t num_nodes, bool remove_self_loops,
                                                             bool remove_duplicates) {
  check_build_csc_args(src, dst, num_nodes);
  check_node_ids_in_range(src, num_nodes, "build_csc", "src");
  check_node_ids_in_range(dst, num_nodes, "build_csc", "dst");
  if (num_nodes <= std::numeric_limits<int32_t>::max()) {
    return build_csc_impl<int32_t>(src, dst, num_nodes, remove_self_loops, remove_duplicates);
  }
  return build_csc_impl<int64_t>(src, dst, num_nodes, remove_self_loops, remove_duplicates);
}

}  // namespace

TORCH_LIBRARY_IMPL(zerocopy, CPU, m) { m.impl("build_csc", &build_csc_cpu); }

}  // namespace zerocopy
