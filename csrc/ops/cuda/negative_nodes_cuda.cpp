// CUDA glue of `zerocopy::negative_nodes`: checks, device pointers and the launch on the current CUDA stream.
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <optional>

#include "ops/cuda/device_access.h"
#include "ops/cuda/negative_nodes_kernel.cuh"
#include "ops/negative_nodes.h"

namespace zerocopy {
namespace {

at::Tensor negative_nodes_cuda(const at::Tensor& positions, int64_t num_nodes, int64_t seed, int64_t endpoint,
                               const std::optional<at::Tensor>& cum_weight) {
  const char* op = kNegativeNodes;
  check_negative_nodes_args(positions, num_nodes, endpoint, cum_weight);
  c10::cuda::CUDAGuard guard(positions.device());
  at::Tensor out = at::empty_like(positions);
  cuda::NegativeArgs args;
  args.positions = positions.const_data_ptr<int64_t>();
  args.n = positions.numel();
  args.num_nodes = num_nodes;
  args.seed = static_cast<uint64_t>(seed);
  args.endpoint = static_cast<uint64_t>(endpoint);
  args.cum_weight = cum_weight.has_value() ? cum_weight->const_data_ptr<double>() : nullptr;
  args.out = out.data_ptr<int64_t>();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(positions.device().index()).stream();
  cuda::check_cuda(cuda::launch_negative_nodes(args, stream), op, "launching the negative-sampling kernel");
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(zerocopy, CUDA, m) { m.impl("negative_nodes", &negative_nodes_cuda); }

}  // namespace zerocopy
