// Argument checks of `zerocopy::gather_rows_into` (out[i] = table[ids[i]]), shared by the CPU and CUDA
// kernels. Host-side only: they read tensor metadata, and `check_gather_ids_host` reads host-resident ids.
#pragma once

#include <ATen/core/Tensor.h>

namespace zerocopy {

// Shapes, dtypes and layouts: `table` 2-D contiguous; `ids` 1-D contiguous int32/int64; `out` contiguous
// (len(ids), table.size(1)) of table's dtype. Raises a Python error naming the argument. Devices are the
// kernel's business.
void check_gather_rows_args(const at::Tensor& table, const at::Tensor& ids, const at::Tensor& out);

// Every id of a CPU `ids` tensor lies in [0, num_rows); otherwise IndexError naming `ids`, the first
// offending id and its position. Reads `ids` only, so it runs before anything is written.
void check_gather_ids_host(const at::Tensor& ids, int64_t num_rows);

// Bytes per table row (0 for a table with no columns).
inline int64_t gather_row_bytes(const at::Tensor& table) {
  return table.size(1) * static_cast<int64_t>(table.element_size());
}

}  // namespace zerocopy
