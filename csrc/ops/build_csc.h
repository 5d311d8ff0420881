// Argument checks of `zerocopy::build_csc` (COO -> CSC over destinations).
#pragma once

#include <ATen/core/Tensor.h>

namespace zerocopy {

// Checks dtypes, shapes, devices and num_nodes; raises a Python error naming the argument.
void check_build_csc_args(const at::Tensor& src, const at::Tensor& dst, int64_t num_nodes);

// Checks that every id of `ids` (int64, contiguous, CPU) is in [0, num_nodes); otherwise raises IndexError
// naming `name`, the first offending id and its position.
void check_node_ids_in_range(const at::Tensor& ids, int64_t num_nodes, const char* op, const char* name);

}  // namespace zerocopy
