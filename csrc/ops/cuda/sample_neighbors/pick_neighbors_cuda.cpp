// CUDA glue of `zerocopy::pick_neighbors`: GPU-resident or UVA topology (as sample_neighbors), CUDA targets.
//
// With a fanout >= 1 the edge buffers are sized by the bound targets * fanout up front, so the call synchronizes
// once, at the end: one read-back of the kernels' status, the edge count and the edge counts at `target_ends`. With
// fanout -1 the edge count is read back first to size the buffers (two read-backs). Temporaries come from
// PyTorch's caching allocator; the prefix sum is at::cumsum.
#include <ATen/ops/cumsum.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/index_select.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstring>
#include <vector>

#include "ops/checks.h"
#include "ops/cuda/device_access.h"
#include "ops/cuda/sample_neighbors/pick_neighbors_kernel.cuh"
#include "ops/cuda/sample_neighbors/sample_neighbors_glue.h"
#include "ops/cuda/sample_neighbors/sample_neighbors_kernel.cuh"
#include "ops/pick_neighbors.h"
#include "ops/pick_policy.h"

namespace zerocopy {
namespace {

constexpr const char* kOp = kPickNeighbors;
constexpr int kStatus = cuda::kSampleStatusSlots;

// Copies `slots` device int64 values to the host (one synchronization of `stream`) and raises a reported error.
std::vector<int64_t> read_back(const at::Tensor& slots, const cuda::Topology& graph, cudaStream_t stream) {
  std::vector<int64_t> host(slots.numel());
  cuda::check_cuda(cudaMemcpyAsync(host.data(), slots.data_ptr(), host.size() * sizeof(int64_t),
                                   cudaMemcpyDeviceToHost, stream),
                   kOp, "reading back the status");
  cuda::check_cuda(cudaStreamSynchronize(stream), kOp, "the picking kernels");
  raise_sample_status(host.data(), graph.num_nodes, graph.num_edges, kOp, "targets");
  return host;
}

PickedEdges pick_neighbors_cuda(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& targets,
                                int64_t fanout, bool replace, int64_t seed, bool node_keyed,
                                c10::IntArrayRef target_ends) {
  check_pick_neighbors_args(indptr, indices, targets, fanout, target_ends);
  TORCH_CHECK_VALUE(targets.device().is_cuda(), kOp, ": `targets` must be a CUDA tensor for GPU sampling, got ",
                    targets.device());
  c10::cuda::CUDAGuard guard(targets.device());
  const int device = targets.device().index();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
  const at::TensorOptions opts = targets.options().dtype(at::kLong);

  const cuda::Topology graph = topology_view(indptr, indices, device, kOp);
  const int64_t count = targets.numel();
  const auto num_ends = static_cast<int64_t>(target_ends.size());

  // status, then the edge counts at target_ends, then the total
  at::Tensor slots = at::empty({kStatus + num_ends + 1}, opts);
  cuda::check_cuda(cudaMemsetAsync(slots.data_ptr(), 0, slots.numel() * sizeof(int64_t), stream), kOp,
                   "clearing the status slots");
  long long* status = reinterpret_cast<long long*>(slots.data_ptr<int64_t>());
  at::Tensor starts = at::empty({count}, opts);
  at::Tensor degrees = at::empty({count}, opts);
  at::Tensor picks = at::empty({count}, opts);
  at::Tensor offsets = at::empty({count + 1}, opts);
  cuda::check_cuda(cudaMemsetAsync(offsets.data_ptr(), 0, sizeof(int64_t), stream), kOp, "offsets init");
  cuda::check_cuda(cuda::launch_count_target_picks(targets.const_data_ptr<int64_t>(), count, graph, fanout, replace,
                                                   starts.data_ptr<int64_t>(), degrees.data_ptr<int64_t>(),
                                                   picks.data_ptr<int64_t>(), status, stream),
                   kOp, "launching count_target_picks");
  if (count > 0) {
    at::Tensor tail = offsets.narrow(0, 1, count);
    at::cumsum_out(tail, picks, 0);
  }
  if (num_ends > 0) {
    std::vector<int64_t> ends(target_ends.begin(), target_ends.end());
    // pinned, so the copy to the device queues on the stream instead of waiting for it
    at::Tensor where = at::empty({num_ends}, at::TensorOptions().dtype(at::kLong).pinned_memory(true));
    std::memcpy(where.data_ptr<int64_t>(), ends.data(), ends.size() * sizeof(int64_t));
    slots.narrow(0, kStatus, num_ends).copy_(at::index_select(offsets, 0, where.to(opts, /*non_blocking=*/true)));
  }
  slots.narrow(0, kStatus + num_ends, 1).copy_(offsets.narrow(0, count, 1));

  const int64_t max_edges = fanout > 0 ? count * fanout : read_back(slots, graph, stream).back();
  at::Tensor nbr = at::empty({max_edges}, opts);
  at::Tensor col = at::empty({max_edges}, opts);
  at::Tensor pos = at::empty({max_edges}, opts);
  at::Tensor scratch;
  if (!replace && fanout > pick::kFloydMaxPicks) scratch = at::empty({pick::kScratchPerPick * max_edges}, opts);
  cuda::check_cuda(cuda::launch_pick_edges(count, targets.const_data_ptr<int64_t>(), starts.const_data_ptr<int64_t>(),
                                           degrees.const_data_ptr<int64_t>(), offsets.const_data_ptr<int64_t>(),
                                           fanout, replace, static_cast<uint64_t>(seed), 0, node_keyed, 0,
                                           pos.data_ptr<int64_t>(), col.data_ptr<int64_t>(),
                                           scratch.defined() ? scratch.data_ptr<int64_t>() : nullptr, stream),
                   kOp, "launching pick_edges");
  cuda::check_cuda(cuda::launch_read_neighbors(max_edges, offsets.const_data_ptr<int64_t>() + count,
                                               pos.const_data_ptr<int64_t>(), graph, nbr.data_ptr<int64_t>(), status,
                                               stream),
                   kOp, "launching read_neighbors");
  const std::vector<int64_t> host = read_back(slots, graph, stream);
  const int64_t num_edges = host.back();
  at::Tensor edge_ends = at::empty({num_ends}, at::kLong);
  std::memcpy(edge_ends.data_ptr<int64_t>(), host.data() + kStatus, num_ends * sizeof(int64_t));
  return {nbr.narrow(0, 0, num_edges), col.narrow(0, 0, num_edges), pos.narrow(0, 0, num_edges), edge_ends};
}

}  // namespace

TORCH_LIBRARY_IMPL(zerocopy, CUDA, m) { m.impl("pick_neighbors", &pick_neighbors_cuda); }

}  // namespace zerocopy
