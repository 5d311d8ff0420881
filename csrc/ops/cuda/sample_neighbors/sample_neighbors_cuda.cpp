// CUDA glue of `zerocopy::sample_neighbors`: GPU-resident or UVA topology, CUDA seeds.
//
// Placement follows the tensors: `seeds` on a GPU selects this kernel; `indptr` and `indices` may each be on
// that GPU or in registered (pinned, mapped) host memory, read through their device aliases (UVA). Every
// temporary comes from PyTorch's caching allocator (at::empty); prefix sums are at::cumsum. Batches whose fanouts
// are all >= 1 (and whose bounds fit a budget) take the lean path (sample_neighbors_lean.cpp: one read-back per
// batch). Otherwise each hop reads back once after the pick counts (to size the edge buffers) and once after
// relabeling (new-node count), and raises any error the kernels reported (bad seed, duplicate seed, bad indptr,
// bad neighbor id) before its result is used.
#include <ATen/ops/cat.h>
#include <ATen/ops/cumsum.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <tuple>
#include <vector>

#include "ops/checks.h"
#include "ops/cuda/device_access.h"
#include "ops/cuda/sample_neighbors/sample_neighbors_glue.h"
#include "ops/cuda/sample_neighbors/sample_neighbors_kernel.cuh"
#include "ops/pick_policy.h"
#include "ops/sample_neighbors.h"

namespace zerocopy {
namespace {

using Sample = CudaSample;
constexpr const char* kOp = kSampleNeighbors;
// Read-back slots: the kernels' error status, then one count.
constexpr int kCountSlot = cuda::kSampleStatusSlots;
constexpr int kReadbackSlots = cuda::kSampleStatusSlots + 1;

// The checks of check_sample_neighbors_args, except that `indptr`/`indices` may live in registered host
// memory while `seeds` is on the GPU (that shared helper requires one device for all three).
void check_args(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& seeds,
                c10::IntArrayRef fanouts) {
  check_csc_and_nodes(indptr, indices, seeds, kOp, "seeds");
  TORCH_CHECK_VALUE(seeds.numel() > 0, kOp, ": `seeds` is empty; a batch needs at least one seed node");
  TORCH_CHECK_VALUE(seeds.device().is_cuda(), kOp, ": `seeds` must be a CUDA tensor for GPU sampling, got ",
                    seeds.device());
  TORCH_CHECK_VALUE(!fanouts.empty(), kOp, ": `fanouts` is empty; give one fanout per hop (-1 = all neighbors)");
  for (size_t hop = 0; hop < fanouts.size(); ++hop) {
    TORCH_CHECK_VALUE(fanouts[hop] > 0 || fanouts[hop] == -1, kOp, ": `fanouts[", hop,
                      "]` must be a positive neighbor count or -1 (all neighbors), got ", fanouts[hop]);
  }
}

int64_t next_pow2(int64_t x) {
  int64_t p = 1;
  while (p < x) p <<= 1;
  return p;
}

// Upper bound on the nodes of one sample, the bound of the Python `max_sampled_nodes` (keep them equal):
// seeds, plus seeds * fanout[0], plus that * fanout[1], ..., capped at num_nodes (>= num_seeds); a -1 fanout gives
// num_nodes. The cap is applied before a product could overflow. Node-keyed, the cap is per level (a node may
// appear at several levels): seeds plus, per hop, min(previous level * fanout, num_nodes).
int64_t node_bound(int64_t num_seeds, c10::IntArrayRef fanouts, int64_t num_nodes, bool node_keyed) {
  if (node_keyed) {
    int64_t bound = num_seeds;
    int64_t level = num_seeds;
    for (int64_t f : fanouts) {
      level = (f < 0 || level > num_nodes / std::max<int64_t>(f, 1)) ? num_nodes : std::min(level * f, num_nodes);
      bound += level;
    }
    return bound;
  }
  int64_t bound = num_seeds;
  int64_t frontier = num_seeds;
  for (int64_t f : fanouts) {
    if (f < 0) return num_nodes;
    if (f > 0 && frontier > (num_nodes - bound) / f) return num_nodes;  // bound + frontier * f > num_nodes
    frontier *= f;
    bound += frontier;
    if (bound >= num_nodes) return num_nodes;
  }
  return bound;
}

class Readback {
 public:
  Readback(const at::TensorOptions& options, cudaStream_t stream)
      : slots_(at::empty({kReadbackSlots}, options)), stream_(stream) {
    cuda::check_cuda(cudaMemsetAsync(slots_.data_ptr(), 0, kReadbackSlots * sizeof(int64_t), stream), kOp,
                     "clearing the status slots");
  }
  long long* status() { return reinterpret_cast<long long*>(slots_.data_ptr<int64_t>()); }

  // Copies the status and `count_src` (one device int64, may be null) to the host, waits, and raises the first
  // error a kernel reported. Returns the count.
  int64_t sync(const int64_t* count_src, int64_t num_nodes, int64_t num_edges) {
    if (count_src != nullptr) {
      cuda::check_cuda(cudaMemcpyAsync(slots_.data_ptr<int64_t>() + kCountSlot, count_src, sizeof(int64_t),
                                       cudaMemcpyDeviceToDevice, stream_),
                       kOp, "copying a count");
    }
    int64_t host[kReadbackSlots];
    cuda::check_cuda(cudaMemcpyAsync(host, slots_.data_ptr(), sizeof(host), cudaMemcpyDeviceToHost, stream_), kOp,
                     "reading back the status");
    cuda::check_cuda(cudaStreamSynchronize(stream_), kOp, "the sampling kernels");
    raise_sample_status(host, num_nodes, num_edges, kOp, "seeds");
    return host[kCountSlot];
  }

 private:
  at::Tensor slots_;
  cudaStream_t stream_;
};

Sample sample_neighbors_cuda(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& seeds,
                             c10::IntArrayRef fanouts, bool replace, int64_t seed, bool node_keyed) {
  check_args(indptr, indices, seeds, fanouts);
  c10::cuda::CUDAGuard guard(seeds.device());
  const int device = seeds.device().index();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
  const at::TensorOptions opts = seeds.options().dtype(at::kLong);

  const cuda::Topology graph = topology_view(indptr, indices, device, kOp);
  const int64_t num_seeds = seeds.numel();
  // With every fanout >= 0 the sample's size is bounded up front and nothing below ever grows; with a -1 hop
  // the table and n_id start small and grow once that hop's edge count is known.
  const bool bounded = std::all_of(fanouts.begin(), fanouts.end(), [](int64_t f) { return f >= 0; });
  const int64_t max_nodes = std::max<int64_t>(graph.num_nodes, num_seeds);
  const auto num_hops = static_cast<int64_t>(fanouts.size());
  // Node-keyed table keys are node + level * num_nodes for levels 0..num_hops.
  TORCH_CHECK_VALUE(!node_keyed || max_nodes <= (std::numeric_limits<int64_t>::max() - 1) / (num_hops + 1), kOp,
                    ": node-keyed sampling of ", num_hops, " hops needs (hops + 1) * num_nodes < 2^63, got num_nodes = ",
                    max_nodes);
  const int64_t bound = bounded ? node_bound(num_seeds, fanouts, max_nodes, node_keyed) : num_seeds;

  if (bounded && lean_sampler_enabled()) {
    std::optional<Sample> lean =
        sample_neighbors_lean(graph, seeds, fanouts, replace, seed, node_keyed, bound, stream);
    if (lean.has_value()) return *std::move(lean);
  }

  // The batch's global -> local table.
  NodeTableStorage storage = make_node_table(bound, opts, stream);
  cuda::NodeTable& table = storage.table;
  Readback readback(opts, stream);
  at::Tensor n_id = at::empty({bound}, opts);
  cuda::check_cuda(cuda::launch_insert_seeds(seeds.const_data_ptr<int64_t>(), num_seeds, graph.num_nodes, table,
                                             n_id.data_ptr<int64_t>(), readback.status(), stream),
                   kOp, "launching insert_seeds");

  // Makes room for `more` nodes after the first `count`: a larger table (the known nodes re-inserted with their
  // local ids, which are unique; node-keyed, an empty one: the next level's keys are new and lower levels are
  // never looked up again) and a larger n_id.
  auto reserve_nodes = [&](int64_t count, int64_t more) {
    const int64_t needed =
        node_keyed ? count + std::min(more, graph.num_nodes) : std::min(count + more, max_nodes);
    if (2 * needed > table.capacity) {
      storage = make_node_table(needed, opts, stream);
      if (!node_keyed) {
        cuda::check_cuda(cuda::launch_insert_seeds(n_id.const_data_ptr<int64_t>(), count, graph.num_nodes, table,
                                                   n_id.data_ptr<int64_t>(), readback.status(), stream),
                         kOp, "launching the table rebuild");
      }
    }
    if (needed > n_id.numel()) {
      at::Tensor grown = at::empty({std::max<int64_t>(needed, 2 * n_id.numel())}, opts);
      grown.narrow(0, 0, count).copy_(n_id.narrow(0, 0, count));
      n_id = grown;
    }
  };

  std::vector<at::Tensor> rows, cols, positions;
  std::vector<int64_t> num_sampled_nodes{num_seeds};
  std::vector<int64_t> num_sampled_edges;
  int64_t t0 = 0;
  int64_t t1 = num_seeds;
  for (size_t hop = 0; hop < fanouts.size(); ++hop) {
    const int64_t fanout = fanouts[hop];
    const int64_t frontier = t1 - t0;
    int64_t num_edges = 0;
    int64_t num_new = 0;
    if (frontier > 0) {
      // (1)-(2) Picks per target and their offsets.
      at::Tensor starts = at::empty({frontier}, opts);
      at::Tensor degrees = at::empty({frontier}, opts);
      at::Tensor picks = at::empty({frontier}, opts);
      at::Tensor offsets = at::empty({frontier + 1}, opts);
      cuda::check_cuda(cudaMemsetAsync(offsets.data_ptr(), 0, sizeof(int64_t), stream), kOp, "offsets init");
      cuda::check_cuda(cuda::launch_count_picks(n_id.const_data_ptr<int64_t>(), t0, frontier, graph, fanout, replace,
                                                starts.data_ptr<int64_t>(), degrees.data_ptr<int64_t>(),
                                                picks.data_ptr<int64_t>(), readback.status(), stream),
                       kOp, "launching count_picks");
      at::Tensor tail = offsets.narrow(0, 1, frontier);
      at::cumsum_out(tail, picks, 0);
      num_edges = readback.sync(offsets.const_data_ptr<int64_t>() + frontier, graph.num_nodes, graph.num_edges);

      if (num_edges > 0) {
        // (3) Picks; (4) neighbor ids into the table; (5)-(6) first appearances numbered in edge order.
        at::Tensor pos = at::empty({num_edges}, opts);
        at::Tensor col = at::empty({num_edges}, opts);
        at::Tensor scratch;
        if (!replace && fanout > pick::kFloydMaxPicks) {
          scratch = at::empty({pick::kScratchPerPick * num_edges}, opts);
        }
        reserve_nodes(t1, num_edges);
        cuda::check_cuda(cuda::launch_pick_edges(frontier, n_id.const_data_ptr<int64_t>(),
                                                 starts.const_data_ptr<int64_t>(),
                                                 degrees.const_data_ptr<int64_t>(), offsets.const_data_ptr<int64_t>(),
                                                 fanout, replace, static_cast<uint64_t>(seed),
                                                 static_cast<int64_t>(hop), node_keyed, t0, pos.data_ptr<int64_t>(),
                                                 col.data_ptr<int64_t>(),
                                                 scratch.defined() ? scratch.data_ptr<int64_t>() : nullptr, stream),
                         kOp, "launching pick_edges");
        at::Tensor nbr = at::empty({num_edges}, opts);
        at::Tensor slot = at::empty({num_edges}, opts);
        const int64_t key_offset = node_keyed ? (static_cast<int64_t>(hop) + 1) * graph.num_nodes : 0;
        cuda::check_cuda(cuda::launch_insert_edges(num_edges, pos.const_data_ptr<int64_t>(), graph, table,
                                                   key_offset, nbr.data_ptr<int64_t>(), slot.data_ptr<int64_t>(),
                                                   readback.status(), stream),
                         kOp, "launching insert_edges");
        at::Tensor flags = at::empty({num_edges}, opts.dtype(at::kInt));
        cuda::check_cuda(cuda::launch_flag_first(num_edges, slot.const_data_ptr<int64_t>(), table,
                                                 flags.data_ptr<int32_t>(), stream),
                         kOp, "launching flag_first");
        at::Tensor incl = at::cumsum(flags, 0, at::kLong);
        num_new = readback.sync(incl.const_data_ptr<int64_t>() + (num_edges - 1), graph.num_nodes, graph.num_edges);

        // (7) Local ids of the neighbors; new nodes appended to n_id (room reserved above).
        at::Tensor row = at::empty({num_edges}, opts);
        cuda::check_cuda(cuda::launch_finalize(num_edges, nbr.const_data_ptr<int64_t>(), slot.const_data_ptr<int64_t>(),
                                               incl.const_data_ptr<int64_t>(), t1, table, row.data_ptr<int64_t>(),
                                               n_id.data_ptr<int64_t>(), stream),
                         kOp, "launching finalize");
        rows.push_back(row);
        cols.push_back(col);
        positions.push_back(pos);
      }
    } else {
      readback.sync(nullptr, graph.num_nodes, graph.num_edges);
    }
    num_sampled_edges.push_back(num_edges);
    num_sampled_nodes.push_back(num_new);
    t0 = t1;
    t1 += num_new;
  }
  auto join = [&](const std::vector<at::Tensor>& parts) {
    if (parts.empty()) return at::empty({0}, opts);
    if (parts.size() == 1) return parts[0];
    return at::cat(parts);
  };
  return {n_id.narrow(0, 0, t1), join(rows), join(cols), join(positions), counts_tensor(num_sampled_nodes),
          counts_tensor(num_sampled_edges)};
}

}  // namespace

void raise_sample_status(const int64_t* status, int64_t num_nodes, int64_t num_edges, const char* op,
                         const char* inputs) {
  switch (status[0]) {
    case cuda::kSampleOk:
      break;
    case cuda::kSampleBadSeed:
      TORCH_CHECK_INDEX(false, op, ": `", inputs, "[", status[1], "]` = ", status[2], " is not a node id in [0, ",
                        num_nodes, ")");
    case cuda::kSampleDuplicateSeed:
      TORCH_CHECK_VALUE(false, op, ": `", inputs, "` must be unique, but node ", status[2],
                        " appears more than once (again at ", inputs, "[", status[1], "] or before it)");
    case cuda::kSampleBadIndptr:
      TORCH_CHECK_VALUE(false, op, ": `indptr` is not a valid CSC pointer at node ", status[1], " (indptr[",
                        status[1], "] = ", status[2], ", indptr[", status[1] + 1, "] = ", status[3], ", indices has ",
                        num_edges, " entries); it must be non-decreasing from 0 to indices.numel()");
    case cuda::kSampleBadNeighbor:
      TORCH_CHECK_INDEX(false, op, ": `indices[", status[1], "]` = ", status[2], " is not a node id in [0, ",
                        num_nodes, ")");
    case cuda::kSampleBoundExceeded:
      TORCH_CHECK_VALUE(false, op, ": hop ", status[1], " needs room for ", status[2],
                        " entries, more than the bound ", status[3], " of the CUDA sampler: `indptr` has overlapping "
                        "neighborhoods, or `", inputs, "` repeat or hold ids out of range");
    default:
      TORCH_CHECK(false, op, ": internal error code ", status[0], " from the CUDA sampler");
  }
}

cuda::Topology topology_view(const at::Tensor& indptr, const at::Tensor& indices, int device, const char* op) {
  cuda::Topology graph;
  graph.indptr = static_cast<const int64_t*>(cuda::device_readable_pointer(indptr, device, op, "indptr"));
  graph.indices = cuda::device_readable_pointer(indices, device, op, "indices");
  graph.indices_int64 = indices.scalar_type() == at::kLong;
  graph.num_nodes = indptr.numel() - 1;
  graph.num_edges = indices.numel();
  return graph;
}

NodeTableStorage make_node_table(int64_t expected_nodes, const at::TensorOptions& options, cudaStream_t stream) {
  const int64_t capacity = next_pow2(std::max<int64_t>(2 * expected_nodes, 1024));
  NodeTableStorage storage;
  storage.keys = at::empty({capacity}, options);
  storage.values = at::empty({capacity}, options);
  storage.first = at::empty({capacity}, options);
  const size_t bytes = capacity * sizeof(int64_t);
  cuda::check_cuda(cudaMemsetAsync(storage.keys.data_ptr(), 0xFF, bytes, stream), kOp, "table init");
  cuda::check_cuda(cudaMemsetAsync(storage.values.data_ptr(), 0xFF, bytes, stream), kOp, "table init");
  cuda::check_cuda(cudaMemsetAsync(storage.first.data_ptr(), 0x7F, bytes, stream), kOp, "table init");
  storage.table.keys = reinterpret_cast<long long*>(storage.keys.data_ptr<int64_t>());
  storage.table.values = reinterpret_cast<long long*>(storage.values.data_ptr<int64_t>());
  storage.table.first = reinterpret_cast<long long*>(storage.first.data_ptr<int64_t>());
  storage.table.capacity = capacity;
  return storage;
}

at::Tensor counts_tensor(const std::vector<int64_t>& counts) {
  at::Tensor out = at::empty({static_cast<int64_t>(counts.size())}, at::kLong);
  std::memcpy(out.data_ptr<int64_t>(), counts.data(), counts.size() * sizeof(int64_t));
  return out;
}

TORCH_LIBRARY_IMPL(zerocopy, CUDA, m) { m.impl("sample_neighbors", &sample_neighbors_cuda); }

}  // namespace zerocopy
