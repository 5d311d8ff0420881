// Raw-pointer CUDA kernel of `zerocopy::negative_nodes` (no torch headers: compiles with plain nvcc).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace zerocopy::cuda {

struct NegativeArgs {
  const int64_t* positions = nullptr;  // n stream counters, device memory
  int64_t n = 0;
  int64_t num_nodes = 0;
  uint64_t seed = 0;
  uint64_t endpoint = 0;
  const double* cum_weight = nullptr;  // num_nodes prefix sums (device-accessible) or nullptr: uniform
  int64_t* out = nullptr;              // n node ids, device memory
};

// Launches the draws on `stream`; returns the launch status, never synchronizes.
cudaError_t launch_negative_nodes(const NegativeArgs& args, cudaStream_t stream);

}  // namespace zerocopy::cuda
