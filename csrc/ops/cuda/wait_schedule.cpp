#include "ops/cuda/wait_schedule.h"

#include <cuda_runtime_api.h>

#include "ops/cuda/returned_status.h"

namespace zerocopy::cuda {

int set_wait_schedule(int device, unsigned int schedule) {
  cudaError_t status = cudaSetDevice(device);
  unsigned int flags = 0;
  if (status == cudaSuccess) status = cudaGetDeviceFlags(&flags);
  if (status != cudaSuccess) return returned(status);
  // cudaGetDeviceFlags may report bits cudaSetDeviceFlags does not take: keep only the settable ones.
  const unsigned int kept = flags & (cudaDeviceMapHost | cudaDeviceLmemResizeToMax);
  return returned(cudaSetDeviceFlags(kept | (schedule & cudaDeviceScheduleMask)));
}

int wait_schedule(int device, unsigned int* schedule) {
  cudaError_t status = cudaSetDevice(device);
  unsigned int flags = 0;
  if (status == cudaSuccess) status = cudaGetDeviceFlags(&flags);
  *schedule = flags & cudaDeviceScheduleMask;
  return returned(status);
}

}  // namespace zerocopy::cuda
