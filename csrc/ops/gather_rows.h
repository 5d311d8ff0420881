// Argument checks of `zerocopy::gather_rows_into` (out[i] = table[ids[i]]), shared by the CPU and CUDA
// kernels. Host-side only: they read tensor metadata (ids are range-checked with check_ids_in_range).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

namespace zerocopy {

inline constexpr const char* kGatherRows = "gather_rows_into";
// How range errors name the bound of `ids`.
inline constexpr const char* kGatherRowsBound = "table.shape[0]";

// Shapes, dtypes and layouts: `table` 2-D contiguous; `ids` 1-D contiguous int32/int64; `out` contiguous
// (len(ids), table.size(1)) of table's dtype; the optional hot-row cache given whole (`cache_slot` and `cache`
// or neither), `cache_slot` int32 with one entry per table row, `cache` contiguous rows of table's width and
// dtype. Raises a Python error naming the argument. Devices are the kernel's business.
void check_gather_rows_args(const at::Tensor& table, const at::Tensor& ids, const at::Tensor& out,
                            const std::optional<at::Tensor>& cache_slot, const std::optional<at::Tensor>& cache);

// Bytes per table row (0 for a table with no columns).
inline int64_t gather_row_bytes(const at::Tensor& table) {
  return table.size(1) * static_cast<int64_t>(table.element_size());
}

}  // namespace zerocopy
