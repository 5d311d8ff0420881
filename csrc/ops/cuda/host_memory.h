// Registration of host memory for the GPU (cudaHostRegister / cudaHostUnregister), for the Python registry of
// page ranges in lightning_zerocopy/graph/host_registration.py. Compiled only in CUDA builds.
//
// Each call clears the calling thread's CUDA error state when it fails: the failure is returned to the caller,
// which handles or raises it, so it is never reported again by an unrelated later launch check.
#pragma once

#include <cstdint>

namespace zerocopy::cuda {

// cudaHostRegister(address, nbytes, flags); returns the cudaError_t as an int (0 = success).
int host_register(uint64_t address, uint64_t nbytes, unsigned int flags);

// cudaHostUnregister(address); returns the cudaError_t as an int (0 = success).
int host_unregister(uint64_t address);

}  // namespace zerocopy::cuda
