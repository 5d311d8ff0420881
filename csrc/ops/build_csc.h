// Argument checks of `zerocopy::build_csc` (COO -> CSC over destinations).
#pragma once

#include <ATen/core/Tensor.h>

namespace zerocopy {

// Checks dtypes, shapes, devices and num_nodes; raises a Python error naming the argument.
void check_build_csc_args(const at::Tensor& src, const at::Tensor& dst, int64_t num_nodes);

}  // namespace zerocopy
