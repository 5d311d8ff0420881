#include "ops/sample_neighbors.h"

#include "ops/checks.h"

namespace zerocopy {

void check_sample_neighbors_args(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& seeds,
                                 c10::IntArrayRef fanouts) {
  const char* op = kSampleNeighbors;
  check_csc_and_nodes(indptr, indices, seeds, op, "seeds");
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
