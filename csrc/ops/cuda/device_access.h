// Host-side helpers of the CUDA glue: turning a tensor into a pointer the GPU may read, and reading a
// kernel's error slot. Compiled only in CUDA builds (included by csrc/ops/cuda/*_cuda.cpp).
#pragma once

#include <ATen/core/Tensor.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace zerocopy::cuda {

// A pointer through which device `device_index` reads the data of `t`:
//  * a CUDA tensor on that device: its data pointer;
//  * a CPU tensor whose memory is pinned and mapped (cudaHostRegister with cudaHostRegisterMapped, or
//    pin_memory()): the device alias of that memory, checked to cover all of `t` (probed every GiB);
//  * anything else raises ValueError naming `name` and saying how to register the memory.
// An empty tensor yields its data pointer unchecked (nothing is read through it).
const void* device_readable_pointer(const at::Tensor& t, int device_index, const char* op, const char* name);

// True when `t` is a CPU tensor whose whole storage range is host memory registered for the GPU.
bool is_registered_host(const at::Tensor& t);

// Raises RuntimeError with `what` and the CUDA error string unless `status` is cudaSuccess.
void check_cuda(cudaError_t status, const char* op, const char* what);

}  // namespace zerocopy::cuda
