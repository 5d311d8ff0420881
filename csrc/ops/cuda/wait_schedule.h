// How this process's host threads wait for the GPU (the schedule bits of cudaSetDeviceFlags), for
// lightning_zerocopy/pipeline/host_waits.py. Compiled only in CUDA builds.
//
// Each call clears the calling thread's CUDA error state when it fails: the failure is returned to the caller,
// which handles or reports it, so it is never reported again by an unrelated later launch check.
#pragma once

namespace zerocopy::cuda {

// Makes `device` current and sets its schedule bits to `schedule` (cudaDeviceScheduleSpin, Yield or BlockingSync),
// keeping its other flags. Returns the cudaError_t as an int (0 = success).
int set_wait_schedule(int device, unsigned int schedule);

// The schedule bits of `device` (its flags masked with cudaDeviceScheduleMask) into *schedule; makes it current.
// Returns the cudaError_t as an int (0 = success).
int wait_schedule(int device, unsigned int* schedule);

}  // namespace zerocopy::cuda
