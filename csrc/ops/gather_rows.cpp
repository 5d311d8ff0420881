#include "ops/gather_rows.h"

#include "ops/checks.h"

namespace zerocopy {

void check_gather_rows_args(const at::Tensor& table, const at::Tensor& ids, const at::Tensor& out,
                            const std::optional<at::Tensor>& cache_slot, const std::optional<at::Tensor>& cache) {
  const char* op = kGatherRows;
  check_dim(table, 2, op, "table");
  check_contiguous(table, op, "table");
  check_index_dtype(ids, op, "ids");
  check_dim(ids, 1, op, "ids");
  check_contiguous(ids, op, "ids");
  TORCH_CHECK_TYPE(out.scalar_type() == table.scalar_type(), op, ": `out` must have the dtype of `table` (",
                   table.scalar_type(), "), got ", out.scalar_type());
  TORCH_CHECK_VALUE(out.dim() == 2 && out.size(0) == ids.size(0) && out.size(1) == table.size(1), op,
                    ": `out` must have shape (len(ids), table.shape[1]) = (", ids.size(0), ", ", table.size(1),
                    "), got ", out.sizes());
  check_contiguous(out, op, "out");
  TORCH_CHECK_VALUE(cache_slot.has_value() == cache.has_value(), op,
                    ": give both `cache_slot` and `cache` (a GPU hot-row cache) or neither");
  if (!cache_slot.has_value()) return;
  const at::Tensor& slot = *cache_slot;
  const at::Tensor& rows = *cache;
  check_dtype(slot, at::kInt, op, "cache_slot");
  check_contiguous(slot, op, "cache_slot");
  check_contiguous(rows, op, "cache");
  TORCH_CHECK_VALUE(slot.dim() == 1 && slot.size(0) == table.size(0), op,
                    ": `cache_slot` must have one int32 entry per table row (", table.size(0), "), got shape ",
                    slot.sizes());
  TORCH_CHECK_VALUE(rows.dim() == 2 && rows.size(1) == table.size(1) && rows.scalar_type() == table.scalar_type(),
                    op, ": `cache` must be a 2-D ", table.scalar_type(), " tensor with ", table.size(1),
                    " columns like `table`, got ", rows.scalar_type(), " of shape ", rows.sizes());
}

}  // namespace zerocopy
