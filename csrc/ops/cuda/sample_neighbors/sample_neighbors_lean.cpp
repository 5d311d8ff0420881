// Lean CUDA glue of `zerocopy::sample_neighbors` (kernels: sample_neighbors_lean_kernel.cu). With every fanout
// >= 1, each hop's frontier and edges are bounded before the first launch (frontier <= previous hop's edges,
// edges <= frontier * fanout, and without replacement <= num_edges), so every buffer is allocated up front from
// PyTorch's caching allocator and the counts stay on the GPU: per hop 4 kernels plus 2 prefix sums, and one
// read-back (status and totals) per batch instead of two per hop. By default the launches of a batch shape are
// captured once in a CUDA graph and replayed (sample_neighbors_lean_graph.cpp).
#include "ops/cuda/sample_neighbors/sample_neighbors_lean.h"

#include <ATen/ops/cumsum.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <atomic>

#include "ops/cuda/device_access.h"
#include "ops/cuda/sample_neighbors/sample_neighbors_lean_kernel.cuh"
#include "ops/pick_policy.h"
#include "ops/sample_neighbors.h"

namespace zerocopy {
namespace {

constexpr const char* kOp = kSampleNeighbors;
// Padded pick slots (sum over hops of frontier bound * fanout) above which the per-hop path, which sizes its
// buffers from the actual counts, uses less memory than these bounds would take.
constexpr int64_t kLeanMaxSlots = int64_t{1} << 24;

std::atomic<bool> lean_enabled{true};

int64_t* ptr(const at::Tensor& t) { return t.data_ptr<int64_t>(); }

int64_t readback_slots(int64_t num_hops) { return cuda::kSampleStatusSlots + 2 * (num_hops + 1); }

}  // namespace

bool lean_sampler_enabled() { return lean_enabled.load(std::memory_order_relaxed); }

bool set_lean_sampler_enabled(bool enabled) { return lean_enabled.exchange(enabled); }

std::optional<LeanShape> lean_shape(const cuda::Topology& graph, int64_t num_seeds, c10::IntArrayRef fanouts,
                                    bool replace, bool node_keyed, int64_t node_capacity) {
  LeanShape shape;
  shape.num_seeds = num_seeds;
  shape.fanouts.assign(fanouts.begin(), fanouts.end());
  shape.replace = replace;
  shape.node_keyed = node_keyed;
  shape.node_capacity = node_capacity;
  int64_t targets = num_seeds;
  for (const int64_t f : fanouts) {
    if (f < 1 || targets > kLeanMaxSlots / f) return std::nullopt;
    const int64_t padded = targets * f;
    shape.slots += padded;
    if (shape.slots > kLeanMaxSlots) return std::nullopt;
    const int64_t edges = replace ? padded : std::min(padded, graph.num_edges);
    shape.max_targets.push_back(targets);
    shape.max_edges.push_back(edges);
    shape.total_edges += edges;
    targets = std::min(edges, graph.num_nodes);
  }
  return shape;
}

at::Tensor lean_inputs_buffer(const at::Tensor& seeds) {
  return at::empty({1 + seeds.numel()}, seeds.options().dtype(at::kLong));
}

void fill_lean_inputs(const at::Tensor& seeds, int64_t rng_seed, const at::Tensor& inputs, cudaStream_t stream) {
  cuda::check_cuda(cuda::launch_lean_inputs(seeds.const_data_ptr<int64_t>(), seeds.numel(), rng_seed,
                                            cuda::LeanInputs{ptr(inputs), seeds.numel()}, stream),
                   kOp, "launching lean_inputs");
}

LeanBatch enqueue_lean(const cuda::Topology& graph, const LeanShape& shape, const at::Tensor& inputs,
                       cudaStream_t stream) {
  const auto num_hops = static_cast<int64_t>(shape.fanouts.size());
  const at::TensorOptions opts = inputs.options();
  LeanBatch batch;
  const int64_t slots = readback_slots(num_hops);
  batch.readback = at::empty({slots}, opts);
  cuda::check_cuda(cudaMemsetAsync(batch.readback.data_ptr(), 0, slots * sizeof(int64_t), stream), kOp,
                   "clearing the status slots");
  auto* status = reinterpret_cast<long long*>(ptr(batch.readback));
  cuda::LeanTotals totals{status + cuda::kSampleStatusSlots, status + cuda::kSampleStatusSlots + num_hops + 1};

  NodeTableStorage table = make_node_table(shape.node_capacity, opts, stream);
  batch.scratch.insert(batch.scratch.end(), {table.keys, table.values, table.first});
  const int64_t edges = std::max<int64_t>(shape.total_edges, 1);
  batch.n_id = at::empty({std::max<int64_t>(shape.node_capacity, 1)}, opts);
  batch.edge_pos = at::empty({edges}, opts);
  batch.col = at::empty({edges}, opts);
  batch.row = at::empty({edges}, opts);
  const cuda::LeanInputs in{ptr(inputs), shape.num_seeds};
  cuda::check_cuda(cuda::launch_lean_seeds(in, graph.num_nodes, table.table, ptr(batch.n_id), status, totals, stream),
                   kOp, "launching lean_seeds");

  for (int64_t h = 0; h < num_hops; ++h) {
    const int64_t f = shape.fanouts[h];
    const int64_t F = shape.max_targets[h];
    const int64_t E = shape.max_edges[h];
    auto buffer = [&](int64_t n, at::ScalarType dtype = at::kLong) {
      batch.scratch.push_back(at::empty({std::max<int64_t>(n, 1)}, opts.dtype(dtype)));
      return batch.scratch.back();
    };
    at::Tensor picks = buffer(F), padded = buffer(F * f), incl_picks = buffer(F);
    at::Tensor nbr = buffer(E), slot = buffer(E), flags = buffer(E, at::kInt), incl_flags = buffer(E);
    cuda::LeanHop hop;
    hop.hop = h;
    hop.fanout = f;
    hop.replace = shape.replace;
    hop.node_keyed = shape.node_keyed;
    hop.key_offset = shape.node_keyed ? (h + 1) * graph.num_nodes : 0;
    hop.rng_seed = in.data;
    hop.max_targets = F;
    hop.max_edges = E;
    hop.max_nodes = shape.node_capacity;
    hop.picks = ptr(picks);
    hop.padded_pos = ptr(padded);
    if (!shape.replace && f > pick::kFloydMaxPicks) hop.scratch = ptr(buffer(pick::kScratchPerPick * F * f));
    hop.incl_picks = ptr(incl_picks);
    hop.nbr = ptr(nbr);
    hop.slot = ptr(slot);
    hop.flags = flags.data_ptr<int32_t>();
    hop.incl_flags = ptr(incl_flags);

    cuda::check_cuda(cuda::launch_lean_count_pick(hop, batch.n_id.const_data_ptr<int64_t>(), graph, totals, status,
                                                  stream),
                     kOp, "launching lean_count_pick");
    if (F > 0) {
      at::Tensor out = incl_picks.narrow(0, 0, F);
      at::cumsum_out(out, picks.narrow(0, 0, F), 0);
    }
    cuda::check_cuda(cuda::launch_lean_insert(hop, graph, table.table, totals, ptr(batch.edge_pos), ptr(batch.col),
                                              status, stream),
                     kOp, "launching lean_insert");
    cuda::check_cuda(cuda::launch_lean_flag(hop, table.table, stream), kOp, "launching lean_flag");
    if (E > 0) {
      at::Tensor out = incl_flags.narrow(0, 0, E);
      at::cumsum_out(out, flags.narrow(0, 0, E), 0, at::kLong);
    }
    cuda::check_cuda(cuda::launch_lean_finalize(hop, table.table, totals, ptr(batch.row), ptr(batch.n_id), status,
                                                stream),
                     kOp, "launching lean_finalize");
  }
  return batch;
}

CudaSample finish_lean(const LeanBatch& batch, const cuda::Topology& graph, int64_t num_hops, cudaStream_t stream,
                       bool copy_out) {
  const int64_t slots = readback_slots(num_hops);
  std::vector<int64_t> host(slots);
  cuda::check_cuda(cudaMemcpyAsync(host.data(), batch.readback.const_data_ptr(), slots * sizeof(int64_t),
                                   cudaMemcpyDeviceToHost, stream),
                   kOp, "reading back the status");
  cuda::check_cuda(cudaStreamSynchronize(stream), kOp, "the sampling kernels");
  raise_sample_status(host.data(), graph.num_nodes, graph.num_edges, kOp, "seeds");

  const int64_t* nodes = host.data() + cuda::kSampleStatusSlots;
  const int64_t* edges = nodes + num_hops + 1;
  std::vector<int64_t> num_sampled_nodes{nodes[0]};
  std::vector<int64_t> num_sampled_edges;
  for (int64_t h = 0; h < num_hops; ++h) {
    num_sampled_nodes.push_back(nodes[h + 1] - nodes[h]);
    num_sampled_edges.push_back(edges[h + 1] - edges[h]);
  }
  const int64_t num_edges = edges[num_hops];
  auto out = [&](const at::Tensor& buffer, int64_t n) {
    at::Tensor view = buffer.narrow(0, 0, n);
    return copy_out ? view.clone() : view;
  };
  return CudaSample{out(batch.n_id, nodes[num_hops]),   out(batch.row, num_edges),
                    out(batch.col, num_edges),          out(batch.edge_pos, num_edges),
                    counts_tensor(num_sampled_nodes), counts_tensor(num_sampled_edges)};
}

std::optional<CudaSample> sample_neighbors_lean(const cuda::Topology& graph, const at::Tensor& seeds,
                                                c10::IntArrayRef fanouts, bool replace, int64_t seed, bool node_keyed,
                                                int64_t node_capacity, cudaStream_t stream) {
  const std::optional<LeanShape> shape =
      lean_shape(graph, seeds.numel(), fanouts, replace, node_keyed, node_capacity);
  if (!shape.has_value()) return std::nullopt;
  std::optional<CudaSample> replayed = sample_lean_with_graph(graph, *shape, seeds, seed, stream);
  if (replayed.has_value()) return replayed;
  const at::Tensor inputs = lean_inputs_buffer(seeds);
  fill_lean_inputs(seeds, seed, inputs, stream);
  const LeanBatch batch = enqueue_lean(graph, *shape, inputs, stream);
  return finish_lean(batch, graph, static_cast<int64_t>(fanouts.size()), stream, /*copy_out=*/false);
}

}  // namespace zerocopy
