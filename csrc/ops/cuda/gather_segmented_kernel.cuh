// Raw-pointer CUDA kernel of `zerocopy::gather_segmented_into`: out[i] = table[ids[i]], where a cached row is
// read from one of several GPU segments (shards of a feature cache: this GPU's, or a peer GPU's memory opened
// over CUDA IPC with peer access enabled) and every other row from `table` (registered host memory or device
// memory). One launch; the row -> (segment, slot) lookup is one read per id.
//
// No torch headers: compiles with plain `nvcc -c` (scripts/compile_cuda_sources.sh); the torch glue is
// csrc/ops/cuda/gather_segmented_cuda.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace zerocopy::cuda {

// Most segments one launch reads (their pointers travel in the launch arguments).
inline constexpr int kMaxSegments = 32;
// Sentinel of the error slots: nothing bad seen.
inline constexpr unsigned long long kNoBadPosition = ~0ull;

struct SegmentedGatherArgs {
  const void* table = nullptr;  // num_rows x row_bytes, device-accessible (device memory or mapped host memory)
  int64_t num_rows = 0;
  int64_t row_bytes = 0;
  const void* ids = nullptr;  // n row ids (int32 or int64), device memory
  bool ids_int64 = true;
  // One entry per table row (int32 or int64), device memory: < 0 = read from `table`, else
  // (segment << slot_bits) | slot.
  const void* location = nullptr;
  bool location_int64 = false;
  int slot_bits = 31;
  int num_segments = 0;
  const void* segments[kMaxSegments] = {};     // segment_rows[s] x row_bytes each, readable by this device
  int64_t segment_rows[kMaxSegments] = {};
  void* out = nullptr;  // n x row_bytes, device memory
  int64_t n = 0;
  // Optional: where the i-th id's row goes in `out` (int64, device memory); nullptr means position i. Used to
  // read rows in ascending id (address) order and write each back to its batch position.
  const int64_t* out_pos = nullptr;
  // Device slots, kNoBadPosition before the launch: the smallest position whose id is out of range, and the
  // smallest position whose lookup entry names a segment or slot that does not exist. Such rows are neither
  // read nor written.
  unsigned long long* bad_id_position = nullptr;
  unsigned long long* bad_location_position = nullptr;
  // Optional (device memory, num_segments + 1 entries): rows served from each segment, then from `table`,
  // added to what is there.
  unsigned long long* counts = nullptr;
};

// Launches the gather on `stream`; returns the launch status. Never synchronizes.
cudaError_t launch_gather_segmented(const SegmentedGatherArgs& args, cudaStream_t stream);

}  // namespace zerocopy::cuda
