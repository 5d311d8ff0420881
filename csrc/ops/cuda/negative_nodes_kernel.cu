// CUDA kernel of `zerocopy::negative_nodes`: one thread per draw, the same draw_negative as the CPU kernel.
#include "ops/cuda/negative_nodes_kernel.cuh"

#include "ops/negative_draw.h"

namespace zerocopy::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) negative_nodes_kernel(const NegativeArgs a) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < a.n; i += stride) {
    a.out[i] = draw_negative(a.seed, a.endpoint, static_cast<uint64_t>(a.positions[i]), a.num_nodes, a.cum_weight);
  }
}

}  // namespace

cudaError_t launch_negative_nodes(const NegativeArgs& args, cudaStream_t stream) {
  if (args.n == 0) return cudaSuccess;
  const int64_t wanted = (args.n + kThreads - 1) / kThreads;
  const int blocks = static_cast<int>(wanted < 65535 ? wanted : 65535);
  negative_nodes_kernel<<<blocks, kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace zerocopy::cuda
