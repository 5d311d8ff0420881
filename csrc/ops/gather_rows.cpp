#include "ops/gather_rows.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <atomic>

#include "ops/checks.h"

namespace zerocopy {

namespace {
constexpr const char* kOp = "gather_rows_into";

template <typename index_t>
void check_ids_impl(const index_t* data, int64_t n, int64_t num_rows) {
  std::atomic<bool> bad{false};
  at::parallel_for(0, n, 1 << 16, [&](int64_t begin, int64_t end) {
    bool local_bad = false;
    for (int64_t i = begin; i < end; ++i) {
      local_bad |= static_cast<uint64_t>(static_cast<int64_t>(data[i])) >= static_cast<uint64_t>(num_rows);
    }
    if (local_bad) bad.store(true, std::memory_order_relaxed);
  });
  if (!bad.load()) return;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = static_cast<int64_t>(data[i]);
    TORCH_CHECK_INDEX(id >= 0, kOp, ": `ids` holds the negative row id ", id, " at position ", i);
    TORCH_CHECK_INDEX(id < num_rows, kOp, ": `ids` holds the row id ", id, " at position ", i,
                      ", out of range for a `table` of ", num_rows, " rows");
  }
}
}  // namespace

void check_gather_rows_args(const at::Tensor& table, const at::Tensor& ids, const at::Tensor& out) {
  check_dim(table, 2, kOp, "table");
  check_contiguous(table, kOp, "table");
  check_index_dtype(ids, kOp, "ids");
  check_dim(ids, 1, kOp, "ids");
  check_contiguous(ids, kOp, "ids");
  TORCH_CHECK_TYPE(out.scalar_type() == table.scalar_type(), kOp, ": `out` must have the dtype of `table` (",
                   table.scalar_type(), "), got ", out.scalar_type());
  TORCH_CHECK_VALUE(out.dim() == 2 && out.size(0) == ids.size(0) && out.size(1) == table.size(1), kOp,
                    ": `out` must have shape (len(ids), table.shape[1]) = (", ids.size(0), ", ", table.size(1),
                    "), got ", out.sizes());
  check_contiguous(out, kOp, "out");
}

void check_gather_ids_host(const at::Tensor& ids, int64_t num_rows) {
  TORCH_CHECK_VALUE(ids.device().is_cpu(), kOp, ": `ids` must be a CPU tensor here, got ", ids.device());
  if (ids.scalar_type() == at::kLong) {
    check_ids_impl(ids.const_data_ptr<int64_t>(), ids.numel(), num_rows);
  } else {
    check_ids_impl(ids.const_data_ptr<int32_t>(), ids.numel(), num_rows);
  }
}

}  // namespace zerocopy
