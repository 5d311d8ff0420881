// Argument checks of `zerocopy::gather_segmented_into`, shared by the CPU and CUDA kernels: out[i] = table[ids[i]]
// with cached rows read from segments (shards of a feature cache) through a per-row lookup. Host-side only.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

namespace zerocopy {

// Most segments one call reads (the CUDA kernel carries one pointer per segment in its launch arguments).
inline constexpr int64_t kMaxGatherSegments = 32;

// Shapes, dtypes, layouts: `table` 2-D contiguous; `ids` 1-D contiguous int32/int64; `out` contiguous
// (len(ids), width) of table's dtype; `location` 1-D contiguous int32/int64 with one entry per table row;
// `slot_bits` in [1, 31] for an int32 lookup, [1, 62] for int64; at most kMaxGatherSegments `segments`, each 2-D
// contiguous with table's width and dtype; `counts` (optional) 1-D contiguous int64 with len(segments) + 1
// entries. Raises a Python error naming the argument. Devices are the kernel's business.
void check_gather_segmented_args(const at::Tensor& table, const at::Tensor& ids, const at::Tensor& out,
                                 const at::Tensor& location, int64_t slot_bits, at::TensorList segments,
                                 const std::optional<at::Tensor>& counts);

}  // namespace zerocopy
