#include "ops/negative_nodes.h"

#include "ops/checks.h"

namespace zerocopy {

void check_negative_nodes_args(const at::Tensor& positions, int64_t num_nodes, int64_t endpoint,
                               const std::optional<at::Tensor>& cum_weight) {
  const char* op = kNegativeNodes;
  check_dtype(positions, at::kLong, op, "positions");
  check_dim(positions, 1, op, "positions");
  check_contiguous(positions, op, "positions");
  TORCH_CHECK_VALUE(num_nodes >= 1, op, ": `num_nodes` must be >= 1 to draw negatives from, got ", num_nodes);
  TORCH_CHECK_VALUE(endpoint == 0 || endpoint == 1, op, ": `endpoint` must be 0 (source) or 1 (destination), got ",
                    endpoint);
  if (!cum_weight.has_value()) return;
  const at::Tensor& cum = *cum_weight;
  check_dtype(cum, at::kDouble, op, "cum_weight");
  check_dim(cum, 1, op, "cum_weight");
  check_contiguous(cum, op, "cum_weight");
  TORCH_CHECK_VALUE(cum.size(0) == num_nodes, op, ": `cum_weight` must have one entry per node (", num_nodes,
                    "), got ", cum.size(0));
  TORCH_CHECK_VALUE(cum.device() == positions.device(), op, ": `cum_weight` is on ", cum.device(),
                    " but `positions` is on ", positions.device(), "; both must be on one device");
}

}  // namespace zerocopy
