// Lean CUDA glue of `zerocopy::sample_neighbors` (kernels: sample_neighbors_lean_kernel.cu). With every fanout
// >= 1, each hop's frontier and edges are bounded before the first launch (frontier <= previous hop's edges,
// edges <= frontier * fanout, and without replacement <= num_edges), so every buffer is allocated up front from
// PyTorch's caching allocator and the counts stay on the GPU: per hop 4 kernels plus 2 prefix sums, and one
// read-back (status and totals) per batch instead of two per hop.
#include <ATen/ops/cumsum.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <atomic>

#include "ops/cuda/device_access.h"
#include "ops/cuda/sample_neighbors_glue.h"
#include "ops/cuda/sample_neighbors_lean_kernel.cuh"
#include "ops/pick_policy.h"
#include "ops/sample_neighbors.h"

namespace zerocopy {
namespace {

constexpr const char* kOp = kSampleNeighbors;
// Padded pick slots (sum over hops of frontier bound * fanout) above which the per-hop path, which sizes its
// buffers from the actual counts, uses less memory than these bounds would take.
constexpr int64_t kLeanMaxSlots = int64_t{1} << 24;

std::atomic<bool> lean_enabled{true};

int64_t* ptr(at::Tensor& t) { return t.data_ptr<int64_t>(); }

}  // namespace

bool lean_sampler_enabled() { return lean_enabled.load(std::memory_order_relaxed); }

bool set_lean_sampler_enabled(bool enabled) { return lean_enabled.exchange(enabled); }

std::optional<CudaSample> sample_neighbors_lean(const cuda::Topology& graph, const at::Tensor& seeds,
                                                c10::IntArrayRef fanouts, bool replace, int64_t seed,
                                                const cuda::NodeTable& table, int64_t node_capacity,
                                                cudaStream_t stream) {
  const auto num_hops = static_cast<int64_t>(fanouts.size());
  const int64_t num_seeds = seeds.numel();
  std::vector<int64_t> max_targets(num_hops), max_edges(num_hops);
  int64_t targets = num_seeds;
  int64_t slots = 0;
  int64_t total_edges = 0;
  for (int64_t h = 0; h < num_hops; ++h) {
    const int64_t f = fanouts[h];
    if (f < 1 || targets > kLeanMaxSlots / f) return std::nullopt;
    const int64_t padded = targets * f;
    slots += padded;
    if (slots > kLeanMaxSlots) return std::nullopt;
    max_targets[h] = targets;
    max_edges[h] = replace ? padded : std::min(padded, graph.num_edges);
    total_edges += max_edges[h];
    targets = std::min(max_edges[h], graph.num_nodes);
  }

  const at::TensorOptions opts = seeds.options().dtype(at::kLong);
  // One read-back buffer: the error status, then nodes[0..H], then edges[0..H].
  const int64_t readback_slots = cuda::kSampleStatusSlots + 2 * (num_hops + 1);
  at::Tensor readback = at::empty({readback_slots}, opts);
  cuda::check_cuda(cudaMemsetAsync(readback.data_ptr(), 0, readback_slots * sizeof(int64_t), stream), kOp,
                   "clearing the status slots");
  auto* status = reinterpret_cast<long long*>(ptr(readback));
  cuda::LeanTotals totals{status + cuda::kSampleStatusSlots, status + cuda::kSampleStatusSlots + num_hops + 1};

  at::Tensor n_id = at::empty({std::max<int64_t>(node_capacity, 1)}, opts);
  at::Tensor edge_pos = at::empty({std::max<int64_t>(total_edges, 1)}, opts);
  at::Tensor col = at::empty({std::max<int64_t>(total_edges, 1)}, opts);
  at::Tensor row = at::empty({std::max<int64_t>(total_edges, 1)}, opts);
  cuda::check_cuda(cuda::launch_lean_seeds(seeds.const_data_ptr<int64_t>(), num_seeds, graph.num_nodes, table,
                                           ptr(n_id), status, totals, stream),
                   kOp, "launching lean_seeds");

  std::vector<at::Tensor> buffers;  // the hops' scratch, alive until the read-back
  for (int64_t h = 0; h < num_hops; ++h) {
    const int64_t f = fanouts[h];
    const int64_t F = max_targets[h];
    const int64_t E = max_edges[h];
    auto buffer = [&](int64_t n, at::ScalarType dtype = at::kLong) {
      buffers.push_back(at::empty({std::max<int64_t>(n, 1)}, opts.dtype(dtype)));
      return buffers.back();
    };
    at::Tensor picks = buffer(F), padded = buffer(F * f), incl_picks = buffer(F);
    at::Tensor nbr = buffer(E), slot = buffer(E), flags = buffer(E, at::kInt), incl_flags = buffer(E);
    cuda::LeanHop hop;
    hop.hop = h;
    hop.fanout = f;
    hop.replace = replace;
    hop.seed = static_cast<uint64_t>(seed);
    hop.max_targets = F;
    hop.max_edges = E;
    hop.max_nodes = node_capacity;
    hop.picks = ptr(picks);
    hop.padded_pos = ptr(padded);
    if (!replace && f > pick::kFloydMaxPicks) {
      at::Tensor scratch = buffer(pick::kScratchPerPick * F * f);
      hop.scratch = ptr(scratch);
    }
    hop.incl_picks = ptr(incl_picks);
    hop.nbr = ptr(nbr);
    hop.slot = ptr(slot);
    hop.flags = flags.data_ptr<int32_t>();
    hop.incl_flags = ptr(incl_flags);

    cuda::check_cuda(cuda::launch_lean_count_pick(hop, n_id.const_data_ptr<int64_t>(), graph, totals, status, stream),
                     kOp, "launching lean_count_pick");
    if (F > 0) {
      at::Tensor out = incl_picks.narrow(0, 0, F);
      at::cumsum_out(out, picks.narrow(0, 0, F), 0);
    }
    cuda::check_cuda(cuda::launch_lean_insert(hop, graph, table, totals, ptr(edge_pos), ptr(col), status, stream),
                     kOp, "launching lean_insert");
    cuda::check_cuda(cuda::launch_lean_flag(hop, table, stream), kOp, "launching lean_flag");
    if (E > 0) {
      at::Tensor out = incl_flags.narrow(0, 0, E);
      at::cumsum_out(out, flags.narrow(0, 0, E), 0, at::kLong);
    }
    cuda::check_cuda(cuda::launch_lean_finalize(hop, table, totals, ptr(row), ptr(n_id), status, stream), kOp,
                     "launching lean_finalize");
  }

  std::vector<int64_t> host(readback_slots);
  cuda::check_cuda(cudaMemcpyAsync(host.data(), readback.const_data_ptr(), readback_slots * sizeof(int64_t),
                                   cudaMemcpyDeviceToHost, stream),
                   kOp, "reading back the status");
  cuda::check_cuda(cudaStreamSynchronize(stream), kOp, "the sampling kernels");
  raise_sample_status(host.data(), graph.num_nodes, graph.num_edges);

  const int64_t* nodes = host.data() + cuda::kSampleStatusSlots;
  const int64_t* edges = nodes + num_hops + 1;
  std::vector<int64_t> num_sampled_nodes{nodes[0]};
  std::vector<int64_t> num_sampled_edges;
  for (int64_t h = 0; h < num_hops; ++h) {
    num_sampled_nodes.push_back(nodes[h + 1] - nodes[h]);
    num_sampled_edges.push_back(edges[h + 1] - edges[h]);
  }
  const int64_t num_edges = edges[num_hops];
  return CudaSample{n_id.narrow(0, 0, nodes[num_hops]), row.narrow(0, 0, num_edges), col.narrow(0, 0, num_edges),
                    edge_pos.narrow(0, 0, num_edges), counts_tensor(num_sampled_nodes),
                    counts_tensor(num_sampled_edges)};
}

}  // namespace zerocopy
