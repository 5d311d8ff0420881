#include "ops/build_csc.h"

#include <limits>

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

}  // namespace zerocopy
