// CPU kernel of `zerocopy::negative_nodes`: one counter-based draw per position (ops/negative_nodes.h).
#include <ATen/Parallel.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <optional>

#include "ops/checks.h"
#include "ops/negative_nodes.h"

namespace zerocopy {
namespace {

at::Tensor negative_nodes_cpu(const at::Tensor& positions, int64_t num_nodes, int64_t seed, int64_t endpoint,
                              const std::optional<at::Tensor>& cum_weight) {
  const char* op = kNegativeNodes;
  check_cpu(positions, op, "positions");
  check_negative_nodes_args(positions, num_nodes, endpoint, cum_weight);
  at::Tensor out = at::empty_like(positions);
  const int64_t n = positions.numel();
  if (n == 0) return out;
  const auto* pos = positions.const_data_ptr<int64_t>();
  const double* cum = cum_weight.has_value() ? cum_weight->const_data_ptr<double>() : nullptr;
  auto* dst = out.data_ptr<int64_t>();
  const auto key = static_cast<uint64_t>(seed);
  // A draw costs a few nanoseconds: only large requests are worth waking the thread pool for.
  at::parallel_for(0, n, 1 << 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      dst[i] = draw_negative(key, static_cast<uint64_t>(endpoint), static_cast<uint64_t>(pos[i]), num_nodes, cum);
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(zerocopy, CPU, m) { m.impl("negative_nodes", &negative_nodes_cpu); }

}  // namespace zerocopy
