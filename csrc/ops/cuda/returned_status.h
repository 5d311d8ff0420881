// A CUDA runtime status handed to Python as an int, for the calls of module.cpp (host_memory, wait_schedule).
#pragma once

#include <cuda_runtime_api.h>

namespace zerocopy::cuda {

// `status` as an int (0 = success). The runtime also keeps a failure as the calling thread's last error; the caller
// reports it, so it is cleared here and never reported again by an unrelated later launch check.
inline int returned(cudaError_t status) {
  if (status != cudaSuccess) (void)cudaGetLastError();
  return static_cast<int>(status);
}

}  // namespace zerocopy::cuda
