#include "ops/cuda/host_memory.h"

#include <cuda_runtime_api.h>

#include "ops/cuda/returned_status.h"

namespace zerocopy::cuda {

int host_register(uint64_t address, uint64_t nbytes, unsigned int flags) {
  return returned(cudaHostRegister(reinterpret_cast<void*>(address), static_cast<size_t>(nbytes), flags));
}

int host_unregister(uint64_t address) { return returned(cudaHostUnregister(reinterpret_cast<void*>(address))); }

}  // namespace zerocopy::cuda
