// Raw-pointer CUDA kernels of `zerocopy::gather_rows_into` (out[i] = table[ids[i]]).
//
// No torch headers: these compile with plain `nvcc -c` (scripts/compile_cuda_sources.sh); the torch glue is
// csrc/ops/cuda/gather_rows_cuda.cpp. `table` is a device-accessible pointer: device memory, or the device
// alias of registered (pinned, mapped) host memory, which the kernel then reads over PCIe (zero-copy).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace zerocopy::cuda {

// Sentinel of the error slot: no bad id seen.
inline constexpr unsigned long long kNoBadId = ~0ull;

struct GatherArgs {
  const void* table = nullptr;      // num_rows x row_bytes, row-major, device-accessible
  int64_t num_rows = 0;
  int64_t row_bytes = 0;
  const void* ids = nullptr;        // n row ids (int32 or int64), device memory
  bool ids_int64 = true;
  // Optional: where the i-th id's row goes in `out` (int64, device memory). nullptr means position i. Used by
  // the address-ordered gather: ids sorted ascending, rows written back to their batch positions.
  const int64_t* out_pos = nullptr;
  // Optional GPU hot-row cache: cache_slot[id] >= 0 means row `id` is cache row cache_slot[id] (int32,
  // num_rows entries, device memory); `cache` holds those rows (row_bytes each, device memory).
  const int32_t* cache_slot = nullptr;
  const void* cache = nullptr;
  void* out = nullptr;              // n x row_bytes, device memory
  int64_t n = 0;
  // Device slot, kNoBadId before the launch; receives the smallest position i whose id is out of range.
  // Such rows are neither read nor written.
  unsigned long long* bad_position = nullptr;
};

// Launches the gather on `stream`. Picks the widest access (16, 8, 4, 2 or 1 bytes) that divides row_bytes
// and the alignment of table/out/cache, and the number of threads per row from the row width. Returns the
// launch status (cudaSuccess or the launch error); never synchronizes.
cudaError_t launch_gather_rows(const GatherArgs& args, cudaStream_t stream);

}  // namespace zerocopy::cuda
