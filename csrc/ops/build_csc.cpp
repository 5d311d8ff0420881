#include "ops/build_csc.h"

#include <ATen/Parallel.h>

#include <atomic>

#include "ops/checks.h"

namespace zerocopy {

namespace {
constexpr const char* kOp = "build_csc";
}  // namespace

void check_build_csc_args(const at::Tensor& src, const at::Tensor& dst, int64_t num_nodes) {
  check_cpu(src, kOp, "src");
  check_cpu(dst, kOp, "dst");
  check_dtype(src, at::kLong, kOp, "src");
  check_dtype(dst, at::kLong, kOp, "dst");
  check_dim(src, 1, kOp, "src");
  check_dim(dst, 1, kOp, "dst");
  check_contiguous(src, kOp, "src");
  check_contiguous(dst, kOp, "dst");
  TORCH_CHECK_VALUE(src.numel() == dst.numel(), kOp, ": `src` and `dst` must have the same length, got ",
                    src.numel(), " and ", dst.numel());
  TORCH_CHECK_VALUE(num_nodes >= 0, kOp, ": `num_nodes` must be >= 0, got ", num_nodes);
  TORCH_CHECK_VALUE(num_nodes < std::numeric_limits<int64_t>::max(), kOp, ": `num_nodes` is too large (",
                    num_nodes, ")");
}

void check_node_ids_in_range(const at::Tensor& ids, int64_t num_nodes, const char* op, const char* name) {
  const int64_t n = ids.numel();
  const int64_t* data = ids.const_data_ptr<int64_t>();
  // Fast parallel scan for any bad id; the (rare) failure path then finds the first one sequentially.
  std::atomic<bool> bad{false};
  at::parallel_for(0, n, 1 << 16, [&](int64_t begin, int64_t end) {
    bool local_bad = false;
    for (int64_t i = begin; i < end; ++i) {
      local_bad |= static_cast<uint64_t>(data[i]) >= static_cast<uint64_t>(num_nodes);
    }
    if (local_bad) bad.store(true, std::memory_order_relaxed);
  });
  if (!bad.load()) return;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = data[i];
    TORCH_CHECK_INDEX(v >= 0, op, ": `", name, "` holds the negative node id ", v, " at position ", i);
    TORCH_CHECK_INDEX(v < num_nodes, op, ": `", name, "` holds the node id ", v, " at position ", i,
                      ", out of range for num_nodes=", num_nodes);
  }
}

}  // namespace zerocopy
