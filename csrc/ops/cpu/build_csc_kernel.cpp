// CPU kernel of `zerocopy::build_csc`: COO (src, dst) -> CSC over dst.
//
// A two-level counting sort that keeps every random access inside the cache:
// 1. partition: targets are grouped into at most kMaxBuckets buckets of 2^shift consecutive ids. Each edge
//    chunk counts its edges per bucket (per-chunk histograms are tiny), and a stable scatter then writes
//    each edge's input position and source into its bucket's region of the outputs. No atomics, and each
//    thread writes to a few thousand sequential streams. A bucket's region is exactly where its targets'
//    CSC segments end up.
// 2. per bucket (parallel over buckets, balanced by edge count): a local counting sort by target inside the
//    bucket's region (histogram of <= 2^shift targets, in cache) which also yields `indptr`; then every
//    target's segment is sorted by (source, input position) -- stable, since ties keep input order -- and,
//    with duplicate removal, keeps the first of each run of equal sources.
// 3. with duplicate removal, a parallel pass compacts the segments into right-sized outputs.
// Self-loops are dropped while counting. The result does not depend on the thread count. Extra memory
// beyond the outputs: per-thread scratch sized by the largest bucket (plus the compacted copies when
// duplicates were actually removed).
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

#include "ops/build_csc.h"
#include "ops/checks.h"

namespace zerocopy {
namespace {

constexpr int64_t kMaxBuckets = 4096;
constexpr int64_t kChunksPerThread = 4;

// log2 of the bucket width: the smallest shift giving at most kMaxBuckets buckets.
int bucket_shift_for(int64_t num_nodes) {
  int shift = 0;
  while ((((num_nodes - 1) >> shift) + 1) > kMaxBuckets) ++shift;
  return shift;
}

// Splits [0, n) (n = offsets.size() - 1 items, item i owning offsets[i]..offsets[i+1]) into chunks of about
// equal weight, for load balance on skewed degrees.
std::vector<int64_t> balanced_chunks(const int64_t* offsets, int64_t n) {
  const int64_t total = offsets[n];
  const int64_t num_chunks =
      std::max<int64_t>(1, std::min<int64_t>(n, static_cast<int64_t>(at::get_num_threads()) * 16));
  std::vector<int64_t> bounds(num_chunks + 1);
  bounds[0] = 0;
  for (int64_t c = 1; c < num_chunks; ++c) {
    const int64_t target = total / num_chunks * c;
    const int64_t i = std::lower_bound(offsets, offsets + n + 1, target) - offsets;
    bounds[c] = std::clamp<int64_t>(i, bounds[c - 1], n);
  }
  bounds[num_chunks] = n;
  return bounds;
}

template <typename index_t>
struct BucketScratch {
  std::vector<int64_t> perm;
  std::vector<index_t> src;
  std::vector<int32_t> local_dst;
  std::vector<int64_t> cursor;
  std::vector<std::pair<int64_t, int64_t>> segment;  // (source, input position)
};

template <typename index_t>
std::tuple<at::Tensor, at::Tensor, at::Tensor> build_csc_impl(const at::Tensor& src_t, const at::Tensor& dst_t,
                                                              int64_t num_nodes, bool remove_self_loops,
                                                              bool remove_duplicates) {
  const int64_t num_input = src_t.numel();
  const int64_t* src = src_t.const_data_ptr<int64_t>();
  const int64_t* dst = dst_t.const_data_ptr<int64_t>();
  const auto long_opts = src_t.options().dtype(at::kLong);
  const auto index_opts = src_t.options().dtype(c10::CppTypeToScalarType<index_t>::value);
  const auto keep = [&](int64_t e) { return !(remove_self_loops && src[e] == dst[e]); };

  const int shift = num_nodes > 0 ? bucket_shift_for(num_nodes) : 0;
  // Local target ids are int32: fine up to 2^43 nodes, far beyond what an int64 indptr fits in memory.
  TORCH_INTERNAL_ASSERT((int64_t{1} << shift) <= std::numeric_limits<int32_t>::max());
  const int64_t num_buckets = num_nodes > 0 ? ((num_nodes - 1) >> shift) + 1 : 0;
  const int64_t num_chunks = std::max<int64_t>(
      1, std::min<int64_t>(static_cast<int64_t>(at::get_num_threads()) * kChunksPerThread,
                           (num_input + 65535) / 65536));
  const int64_t chunk_edges = (num_input + num_chunks - 1) / std::max<int64_t>(num_chunks, 1);

  // 1a. per-chunk bucket histograms.
  std::vector<int64_t> offsets(num_chunks * num_buckets, 0);
  at::parallel_for(0, num_chunks, 1, [&](int64_t cbegin, int64_t cend) {
    for (int64_t c = cbegin; c < cend; ++c) {
      int64_t* count = offsets.data() + c * num_buckets;
      const int64_t end = std::min(num_input, (c + 1) * chunk_edges);
      for (int64_t e = c * chunk_edges; e < end; ++e) {
        if (keep(e)) ++count[dst[e] >> shift];
      }
    }
  });
  // 1b. exclusive prefix in (bucket, chunk) order: chunk c's first slot in bucket b; bucket_begin[b] its region.
  std::vector<int64_t> bucket_begin(num_buckets + 1, 0);
  int64_t running = 0;
  for (int64_t b = 0; b < num_buckets; ++b) {
    bucket_begin[b] = running;
    for (int64_t c = 0; c < num_chunks; ++c) {
      const int64_t count = offsets[c * num_buckets + b];
      offsets[c * num_buckets + b] = running;
      running += count;
    }
  }
  bucket_begin[num_buckets] = running;
  const int64_t num_edges = running;

  // 1c. stable scatter of (input position, source) into bucket regions.
  at::Tensor perm_t = at::empty({num_edges}, long_opts);
  at::Tensor indices_t = at::empty({num_edges}, index_opts);
  int64_t* perm = perm_t.data_ptr<int64_t>();
  index_t* indices = indices_t.data_ptr<index_t>();
  at::parallel_for(0, num_chunks, 1, [&](int64_t cbegin, int64_t cend) {
    for (int64_t c = cbegin; c < cend; ++c) {
      int64_t* cursor = offsets.data() + c * num_buckets;
      const int64_t end = std::min(num_input, (c + 1) * chunk_edges);
      for (int64_t e = c * chunk_edges; e < end; ++e) {
        if (!keep(e)) continue;
        const int64_t pos = cursor[dst[e] >> shift]++;
        perm[pos] = e;
        indices[pos] = static_cast<index_t>(src[e]);
      }
    }
  });

  // 2. per bucket: counting sort by target (yields indptr), then sort each segment by (source, position).
  at::Tensor indptr_t = at::empty({num_nodes + 1}, long_opts);
  int64_t* indptr = indptr_t.data_ptr<int64_t>();
  indptr[num_nodes] = num_edges;
  // With duplicate removal, kept[v + 1] = number of edges v keeps (becomes the compacted indptr).
  at::Tensor kept_t = remove_duplicates ? at::zeros({num_nodes + 1}, long_opts) : at::Tensor();
  int64_t* kept = remove_duplicates ? kept_t.data_ptr<int64_t>() : nullptr;
  const std::vector<int64_t> bucket_chunks = balanced_chunks(bucket_begin.data(), num_buckets);
  at::parallel_for(0, static_cast<int64_t>(bucket_chunks.size()) - 1, 1, [&](int64_t cbegin, int64_t cend) {
    BucketScratch<index_t> s;
    for (int64_t b = bucket_chunks[cbegin]; b < bucket_chunks[cend]; ++b) {
      const int64_t first_node = b << shift;
      const int64_t width = std::min<int64_t>(int64_t{1} << shift, num_nodes - first_node);
      const int64_t region = bucket_begin[b];
      const int64_t size = bucket_begin[b + 1] - region;
      s.cursor.assign(width + 1, 0);
      s.perm.assign(perm + region, perm + region + size);
      s.src.assign(indices + region, indices + region + size);
      s.local_dst.resize(size);
      for (int64_t k = 0; k < size; ++k) {
        const auto local = static_cast<int32_t>(dst[s.perm[k]] - first_node);
        s.local_dst[k] = local;
        ++s.cursor[local + 1];
      }
      for (int64_t v = 0; v < width; ++v) {
        s.cursor[v + 1] += s.cursor[v];
        indptr[first_node + v] = region + s.cursor[v];
      }
      for (int64_t k = 0; k < size; ++k) {
        const int64_t pos = region + s.cursor[s.local_dst[k]]++;
        perm[pos] = s.perm[k];
        indices[pos] = s.src[k];
      }
      for (int64_t v = first_node; v < first_node + width; ++v) {
        const int64_t begin = indptr[v];
        const int64_t degree = (v + 1 < first_node + width ? indptr[v + 1] : region + size) - begin;
        if (degree <= 1) {
          if (kept) kept[v + 1] = degree;
          continue;
        }
        s.segment.resize(degree);
        for (int64_t k = 0; k < degree; ++k) s.segment[k] = {indices[begin + k], perm[begin + k]};
        std::sort(s.segment.begin(), s.segment.end());
        int64_t out = 0;
        for (int64_t k = 0; k < degree; ++k) {
          if (remove_duplicates && out > 0 && s.segment[k].first == s.segment[k - 1].first) continue;
          indices[begin + out] = static_cast<index_t>(s.segment[k].first);
          perm[begin + out] = s.segment[k].second;
          ++out;
        }
        if (kept) kept[v + 1] = out;
      }
    }
  });
  if (!remove_duplicates) return {indptr_t, indices_t, perm_t};

  // 3. compact: each segment's kept prefix moves to its new offset.
  for (int64_t v = 0; v < num_nodes; ++v) kept[v + 1] += kept[v];
  const int64_t num_kept = kept[num_nodes];
  if (num_kept == num_edges) return {indptr_t, indices_t, perm_t};
  at::Tensor new_indices_t = at::empty({num_kept}, index_opts);
  at::Tensor new_perm_t = at::empty({num_kept}, long_opts);
  index_t* new_indices = new_indices_t.data_ptr<index_t>();
  int64_t* new_perm = new_perm_t.data_ptr<int64_t>();
  const std::vector<int64_t> node_chunks = balanced_chunks(kept, num_nodes);
  at::parallel_for(0, static_cast<int64_t>(node_chunks.size()) - 1, 1, [&](int64_t cbegin, int64_t cend) {
    for (int64_t v = node_chunks[cbegin]; v < node_chunks[cend]; ++v) {
      const int64_t count = kept[v + 1] - kept[v];
      std::copy_n(indices + indptr[v], count, new_indices + kept[v]);
      std::copy_n(perm + indptr[v], count, new_perm + kept[v]);
    }
  });
  return {kept_t, new_indices_t, new_perm_t};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> build_csc_cpu(const at::Tensor& src, const at::Tensor& dst,
                                                             int64_t num_nodes, bool remove_self_loops,
                                                             bool remove_duplicates) {
  check_build_csc_args(src, dst, num_nodes);
  check_ids_in_range(src, num_nodes, "build_csc", "src", "num_nodes");
  check_ids_in_range(dst, num_nodes, "build_csc", "dst", "num_nodes");
  if (num_nodes <= std::numeric_limits<int32_t>::max()) {
    return build_csc_impl<int32_t>(src, dst, num_nodes, remove_self_loops, remove_duplicates);
  }
  return build_csc_impl<int64_t>(src, dst, num_nodes, remove_self_loops, remove_duplicates);
}

}  // namespace

TORCH_LIBRARY_IMPL(zerocopy, CPU, m) { m.impl("build_csc", &build_csc_cpu); }

}  // namespace zerocopy
