#include "ops/cuda/host_memory.h"

#include <cuda_runtime_api.h>

namespace zerocopy::cuda {
namespace {

int returned(cudaError_t status) {
  // The runtime also keeps the failure as this thread's last error; it is reported here, so clear it.
  if (status != cudaSuccess) (void)cudaGetLastError();
  return static_cast<int>(status);
}

}  // namespace

int host_register(uint64_t address, uint64_t nbytes, unsigned int flags) {
  return returned(cudaHostRegister(reinterpret_cast<void*>(address), static_cast<size_t>(nbytes), flags));
}

int host_unregister(uint64_t address) { return returned(cudaHostUnregister(reinterpret_cast<void*>(address))); }

}  // namespace zerocopy::cuda
