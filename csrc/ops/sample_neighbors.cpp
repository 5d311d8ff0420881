#include "ops/sample_neighbors.h"

#include "ops/checks.h"

namespace zerocopy {

void check_sample_neighbors_args(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& seeds,
                                 c10::IntArrayRef fanouts) {
  const char* op = kSampleNeighbors;
  check_dtype(indptr, at::kLong, op, "indptr");
  check_index_dtype(indices, op, "indices");
  check_dtype(seeds, at::kLong, op, "seeds");
  check_dim(indptr, 1, op, "indptr");
  check_dim(indices, 1, op, "indices");
  check_dim(seeds, 1, op, "seeds");
  check_contiguous(indptr, op, "indptr");
  check_contiguous(indices, op, "indices");
  check_contiguous(seeds, op, "seeds");
  TORCH_CHECK_VALUE(indptr.numel() >= 1, op, ": `indptr` must have num_nodes + 1 >= 1 entries, got none");
  TORCH_CHECK_VALUE(seeds.numel() > 0, op, ": `seeds` is empty; a batch needs at least one seed node");
  TORCH_CHECK_VALUE(indices.device() == indptr.device() && seeds.device() == indptr.device(), op,
                    ": `indptr`, `indices` and `seeds` must be on one device, got ", indptr.device(), ", ",
                    indices.device(), " and ", seeds.device());
  TORCH_CHECK_VALUE(!fanouts.empty(), op, ": `fanouts` is empty; give one fanout per hop (-1 = all neighbors)");
  for (size_t hop = 0; hop < fanouts.size(); ++hop) {
    TORCH_CHECK_VALUE(fanouts[hop] > 0 || fanouts[hop] == -1, op, ": `fanouts[", hop,
                      "]` must be a positive neighbor count or -1 (all neighbors), got ", fanouts[hop]);
  }
}

}  // namespace zerocopy
