// `zerocopy::negative_nodes`: node ids for negative edges, each drawn from its own counter-based stream.
//
// out[i] = draw_negative(seed, endpoint, positions[i], ...) (ops/negative_draw.h): a pure function of its key and
// the weights, so a negative does not depend on the device, the thread or the order it is drawn in; the CPU and
// CUDA kernels give bitwise the same ids.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

#include "ops/negative_draw.h"

namespace zerocopy {

inline constexpr const char* kNegativeNodes = "negative_nodes";

// Shapes, dtypes, devices and values the kernels rely on; raises a Python error naming the argument.
void check_negative_nodes_args(const at::Tensor& positions, int64_t num_nodes, int64_t endpoint,
                               const std::optional<at::Tensor>& cum_weight);

}  // namespace zerocopy
