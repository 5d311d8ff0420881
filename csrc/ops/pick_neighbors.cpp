#include "ops/pick_neighbors.h"

#include "ops/checks.h"

namespace zerocopy {

void check_pick_neighbors_args(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& targets,
                               int64_t fanout, c10::IntArrayRef target_ends) {
  const char* op = kPickNeighbors;
  check_csc_and_nodes(indptr, indices, targets, op, "targets");
  TORCH_CHECK_VALUE(fanout > 0 || fanout == -1, op, ": `fanout` must be a positive neighbor count or -1 (all "
                    "neighbors), got ", fanout);
  int64_t previous = 0;
  for (size_t s = 0; s < target_ends.size(); ++s) {
    TORCH_CHECK_VALUE(previous <= target_ends[s] && target_ends[s] <= targets.numel(), op, ": `target_ends[", s,
                      "]` = ", target_ends[s], " must be in [", previous, ", ", targets.numel(),
                      "] (non-decreasing positions in `targets`)");
    previous = target_ends[s];
  }
}

}  // namespace zerocopy
