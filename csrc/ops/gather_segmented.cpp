#include "ops/gather_segmented.h"

#include "ops/checks.h"

namespace zerocopy {

namespace {
constexpr const char* kOp = "gather_segmented_into";
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

}  // namespace zerocopy
