#include "ops/pick_neighbors.h"

#include "ops/checks.h"

namespace zerocopy {

void check_pick_neighbors_args(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& targets,
                               int64_t fanout, c10::IntArrayRef target_ends) {
  const char* op = kPickNeighbors;
  check_dtype(indptr, at::kLong, op, "indptr");
  check_index_dtype(indices, op, "indices");
  check_dtype(targets, at::kLong, op, "targets");
  check_dim(indptr, 1, op, "indptr");
  check_dim(indices, 1, op, "indices");
  check_dim(targets, 1, op, "targets");
  check_contiguous(indptr, op, "indptr");
  check_contiguous(indices, op, "indices");
  check_contiguous(targets, op, "targets");
  TORCH_CHECK_VALUE(indptr.numel() >= 1, op, ": `indptr` must have num_nodes + 1 >= 1 entries, got none");
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
