// Argument checks and result type of `zerocopy::pick_neighbors` (one hop of `sample_neighbors` without its
// deduplication and relabeling), shared by its CPU and CUDA kernels.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <tuple>

namespace zerocopy {

inline constexpr const char* kPickNeighbors = "pick_neighbors";

// (nbr, col, edge_pos, edge_ends): per picked edge the neighbor id, the target's position in `targets` and the
// edge's position in `indices`; per entry of `target_ends`, the number of edges of the targets before it (CPU).
using PickedEdges = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// Validates what needs no data reads: dtypes, shapes, contiguity, the fanout, and `target_ends` (non-decreasing,
// within [0, targets.numel()]). `indptr`/`indices` may live in registered host memory for the CUDA kernel, so
// devices are checked by each kernel. Raises TypeError (dtype) or ValueError, naming the argument.
void check_pick_neighbors_args(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& targets,
                               int64_t fanout, c10::IntArrayRef target_ends);

}  // namespace zerocopy
