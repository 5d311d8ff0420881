#include "ops/checks.h"

#include <ATen/Parallel.h>

#include <atomic>

namespace zerocopy {
namespace {

template <typename index_t>
void check_range(const index_t* data, int64_t n, int64_t bound, const char* op, const char* name,
                 const char* bound_name) {
  std::atomic<bool> bad{false};
  at::parallel_for(0, n, 1 << 16, [&](int64_t begin, int64_t end) {
    bool local_bad = false;
    for (int64_t i = begin; i < end; ++i) {
      local_bad |= static_cast<uint64_t>(static_cast<int64_t>(data[i])) >= static_cast<uint64_t>(bound);
    }
    if (local_bad) bad.store(true, std::memory_order_relaxed);
  });
  if (!bad.load()) return;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = static_cast<int64_t>(data[i]);
    TORCH_CHECK_INDEX(id >= 0, op, ": `", name, "` holds the negative id ", id, " at position ", i);
    TORCH_CHECK_INDEX(id < bound, op, ": `", name, "` holds the id ", id, " at position ", i,
                      ", out of range for ", bound_name, "=", bound);
  }
}

}  // namespace

void check_ids_in_range(const at::Tensor& ids, int64_t bound, const char* op, const char* name,
                        const char* bound_name) {
  check_cpu(ids, op, name);
  check_index_dtype(ids, op, name);
  check_contiguous(ids, op, name);
  if (ids.scalar_type() == at::kLong) {
    check_range(ids.const_data_ptr<int64_t>(), ids.numel(), bound, op, name, bound_name);
  } else {
    check_range(ids.const_data_ptr<int32_t>(), ids.numel(), bound, op, name, bound_name);
  }
}

}  // namespace zerocopy
