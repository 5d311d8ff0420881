#include "ops/gather_segmented.h"

#include <ATen/Parallel.h>

#include <atomic>

#include "ops/checks.h"

namespace zerocopy {

namespace {
constexpr const char* kOp = "gather_segmented_into";

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
    TORCH_CHECK_INDEX(id >= 0 && id < num_rows, kOp, ": `ids` holds the row id ", id, " at position ", i,
                      ", out of range for a `table` of ", num_rows, " rows");
  }
}
}  // namespace

void check_gather_segmented_args(const at::Tensor& table, const at::Tensor& ids, const at::Tensor& out,
                                 const at::Tensor& location, int64_t slot_bits, at::TensorList segments,
                                 const std::optional<at::Tensor>& counts) {
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
  check_index_dtype(location, kOp, "location");
  check_contiguous(location, kOp, "location");
  TORCH_CHECK_VALUE(location.dim() == 1 && location.size(0) == table.size(0), kOp,
                    ": `location` must have one entry per table row (", table.size(0), "), got shape ",
                    location.sizes());
  const int64_t max_bits = location.scalar_type() == at::kInt ? 31 : 62;
  TORCH_CHECK_VALUE(slot_bits >= 1 && slot_bits <= max_bits, kOp, ": `slot_bits` must be in [1, ", max_bits,
                    "] for a ", location.scalar_type(), " `location`, got ", slot_bits);
  TORCH_CHECK_VALUE(static_cast<int64_t>(segments.size()) <= kMaxGatherSegments, kOp, ": at most ",
                    kMaxGatherSegments, " `segments` per call, got ", segments.size());
  for (size_t s = 0; s < segments.size(); ++s) {
    const at::Tensor& seg = segments[s];
    TORCH_CHECK_VALUE(seg.dim() == 2 && seg.size(1) == table.size(1) && seg.scalar_type() == table.scalar_type(),
                      kOp, ": `segments[", s, "]` must be a 2-D ", table.scalar_type(), " tensor with ",
                      table.size(1), " columns like `table`, got ", seg.scalar_type(), " of shape ", seg.sizes());
    TORCH_CHECK_VALUE(seg.is_contiguous(), kOp, ": `segments[", s, "]` must be contiguous");
  }
  if (counts.has_value()) {
    const at::Tensor& c = *counts;
    check_dtype(c, at::kLong, kOp, "counts");
    check_contiguous(c, kOp, "counts");
    TORCH_CHECK_VALUE(c.dim() == 1 && c.size(0) == static_cast<int64_t>(segments.size()) + 1, kOp,
                      ": `counts` must have len(segments) + 1 = ", segments.size() + 1, " entries, got shape ",
                      c.sizes());
  }
}

void check_segmented_ids_host(const at::Tensor& ids, int64_t num_rows) {
  TORCH_CHECK_VALUE(ids.device().is_cpu(), kOp, ": `ids` must be a CPU tensor here, got ", ids.device());
  if (ids.scalar_type() == at::kLong) {
    check_ids_impl(ids.const_data_ptr<int64_t>(), ids.numel(), num_rows);
  } else {
    check_ids_impl(ids.const_data_ptr<int32_t>(), ids.numel(), num_rows);
  }
}

}  // namespace zerocopy
