// CPU kernel of `zerocopy::gather_segmented_into`, the reference of the CUDA kernel: out[i] = table[ids[i]],
// where location[ids[i]] >= 0 means the row is slot (location & (2^slot_bits - 1)) of segment
// (location >> slot_bits) instead. Every id and every lookup entry used is checked before the first byte is
// written, so a bad id or a corrupt lookup never reads outside a tensor.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "ops/checks.h"
#include "ops/gather_segmented.h"

namespace zerocopy {
namespace {

constexpr const char* kOp = "gather_segmented_into";
constexpr int64_t kBytesPerTask = 64 * 1024;

// Fills `src` with each row's address and `counts` with rows per source (segments, then the table).
template <typename IdT, typename LocT>
void resolve_rows(const IdT* ids, int64_t n, const LocT* location, int64_t slot_bits, const char* table,
                  int64_t row_bytes, const std::vector<const char*>& seg_ptr, const std::vector<int64_t>& seg_rows,
                  std::vector<const char*>& src, std::vector<int64_t>& counts) {
  const int64_t num_segments = static_cast<int64_t>(seg_ptr.size());
  const int64_t slot_mask = (int64_t{1} << slot_bits) - 1;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = static_cast<int64_t>(ids[i]);
    const int64_t code = static_cast<int64_t>(location[id]);
    if (code < 0) {
      src[i] = table + id * row_bytes;
      ++counts[num_segments];
      continue;
    }
    const int64_t segment = code >> slot_bits;
    const int64_t slot = code & slot_mask;
    TORCH_CHECK_VALUE(segment < num_segments && slot < seg_rows[segment], kOp, ": `location` sends row ", id,
                      " (position ", i, " of `ids`) to slot ", slot, " of segment ", segment, ", but there are ",
                      num_segments, " segment(s)",
                      segment < num_segments ? " and that one has " + std::to_string(seg_rows[segment]) + " rows"
                                             : std::string());
    src[i] = seg_ptr[segment] + slot * row_bytes;
    ++counts[segment];
  }
}

void gather_segmented_into_cpu(const at::Tensor& table, const at::Tensor& ids, const at::Tensor& out,
                               const at::Tensor& location, int64_t slot_bits, at::TensorList segments,
                               const std::optional<at::Tensor>& counts, bool /*sort_ids: read order only*/) {
  check_cpu(table, kOp, "table");
  check_cpu(ids, kOp, "ids");
  check_cpu(out, kOp, "out");
  check_cpu(location, kOp, "location");
  for (const at::Tensor& seg : segments) check_cpu(seg, kOp, "segments[i]");
  if (counts.has_value()) check_cpu(*counts, kOp, "counts");
  check_gather_segmented_args(table, ids, out, location, slot_bits, segments, counts);
  check_ids_in_range(ids, table.size(0), kOp, "ids", "table.shape[0]");
  const int64_t n = ids.numel();
  const int64_t row_bytes = table.size(1) * static_cast<int64_t>(table.element_size());

  std::vector<const char*> seg_ptr;
  std::vector<int64_t> seg_rows;
  for (const at::Tensor& seg : segments) {
    seg_ptr.push_back(static_cast<const char*>(seg.const_data_ptr()));
    seg_rows.push_back(seg.size(0));
  }
  std::vector<const char*> src(static_cast<size_t>(n));
  std::vector<int64_t> per_source(segments.size() + 1, 0);
  const auto* table_bytes = static_cast<const char*>(table.const_data_ptr());
  const bool ids64 = ids.scalar_type() == at::kLong;
  const bool loc64 = location.scalar_type() == at::kLong;
  if (ids64 && loc64) {
    resolve_rows(ids.const_data_ptr<int64_t>(), n, location.const_data_ptr<int64_t>(), slot_bits, table_bytes,
                 row_bytes, seg_ptr, seg_rows, src, per_source);
  } else if (ids64) {
    resolve_rows(ids.const_data_ptr<int64_t>(), n, location.const_data_ptr<int32_t>(), slot_bits, table_bytes,
                 row_bytes, seg_ptr, seg_rows, src, per_source);
  } else if (loc64) {
    resolve_rows(ids.const_data_ptr<int32_t>(), n, location.const_data_ptr<int64_t>(), slot_bits, table_bytes,
                 row_bytes, seg_ptr, seg_rows, src, per_source);
  } else {
    resolve_rows(ids.const_data_ptr<int32_t>(), n, location.const_data_ptr<int32_t>(), slot_bits, table_bytes,
                 row_bytes, seg_ptr, seg_rows, src, per_source);
  }

  if (n > 0 && row_bytes > 0) {
    auto* dst = static_cast<char*>(out.data_ptr());
    const int64_t grain = std::max<int64_t>(1, kBytesPerTask / row_bytes);
    at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        std::memcpy(dst + i * row_bytes, src[i], static_cast<size_t>(row_bytes));
      }
    });
  }
  if (counts.has_value()) {
    int64_t* c = counts->data_ptr<int64_t>();
    for (size_t s = 0; s < per_source.size(); ++s) c[s] += per_source[s];
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(zerocopy, CPU, m) { m.impl("gather_segmented_into", &gather_segmented_into_cpu); }

}  // namespace zerocopy
