// CPU kernel of `zerocopy::gather_rows_into`: out[i] = table[ids[i]], rows copied as bytes.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "ops/checks.h"
#include "ops/gather_rows.h"

namespace zerocopy {
namespace {

// Each parallel chunk copies at least this many bytes, so tiny rows are not split into tiny tasks.
constexpr int64_t kBytesPerTask = 64 * 1024;

// Rows are requested at random, so the hardware prefetcher cannot guess them: the first cache lines of the
// row kPrefetchDistance ahead are prefetched explicitly (the prefetcher follows the rest of a long row).
constexpr int64_t kPrefetchDistance = 8;
constexpr int64_t kPrefetchLines = 4;
constexpr int64_t kCacheLine = 64;

template <typename index_t>
void gather_bytes(const char* table, const index_t* ids, char* out, int64_t n, int64_t row_bytes) {
  const int64_t grain = std::max<int64_t>(1, kBytesPerTask / std::max<int64_t>(row_bytes, 1));
  const int64_t prefetch_bytes = std::min(row_bytes, kPrefetchLines * kCacheLine);
  at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (i + kPrefetchDistance < end) {
        const char* ahead = table + static_cast<int64_t>(ids[i + kPrefetchDistance]) * row_bytes;
        for (int64_t b = 0; b < prefetch_bytes; b += kCacheLine) __builtin_prefetch(ahead + b, 0, 0);
      }
      std::memcpy(out + i * row_bytes, table + static_cast<int64_t>(ids[i]) * row_bytes,
                  static_cast<size_t>(row_bytes));
    }
  });
}

void gather_rows_into_cpu(const at::Tensor& table, const at::Tensor& ids, const at::Tensor& out, bool sort_ids,
                          const std::optional<at::Tensor>& cache_slot, const std::optional<at::Tensor>& cache) {
  (void)sort_ids;  // a read-order hint for the CUDA kernel; the CPU reads in batch order, with the same result
  const char* op = kGatherRows;
  check_cpu(table, op, "table");
  check_cpu(ids, op, "ids");
  check_cpu(out, op, "out");
  check_gather_rows_args(table, ids, out, cache_slot, cache);
  TORCH_CHECK_VALUE(!cache_slot.has_value(), op,
                    ": `cache_slot`/`cache` (a GPU hot-row cache) need CUDA `ids`; on the CPU gather from `table`");
  // Every id is checked before the first byte is written: a bad id never reads outside `table`.
  check_ids_in_range(ids, table.size(0), op, "ids", kGatherRowsBound);
  const int64_t row_bytes = gather_row_bytes(table);
  const int64_t n = ids.numel();
  if (n == 0 || row_bytes == 0) return;
  const auto* src = static_cast<const char*>(table.const_data_ptr());
  auto* dst = static_cast<char*>(out.data_ptr());
  if (ids.scalar_type() == at::kLong) {
    gather_bytes(src, ids.const_data_ptr<int64_t>(), dst, n, row_bytes);
  } else {
    gather_bytes(src, ids.const_data_ptr<int32_t>(), dst, n, row_bytes);
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(zerocopy, CPU, m) { m.impl("gather_rows_into", &gather_rows_into_cpu); }

}  // namespace zerocopy
