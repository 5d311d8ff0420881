// Argument checks of `zerocopy::sample_neighbors`, shared by its CPU and CUDA kernels.
//
// These are the checks that need no data reads: dtypes, shapes, contiguity, devices and the fanouts.
// Each kernel range-checks seeds, indptr entries and neighbor ids as it reads them.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

namespace zerocopy {

inline constexpr const char* kSampleNeighbors = "sample_neighbors";

// Validates every argument of sample_neighbors that can be checked without reading tensor data.
// Raises TypeError (dtype) or ValueError (shape, contiguity, device, fanouts), naming the argument.
void check_sample_neighbors_args(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& seeds,
                                 c10::IntArrayRef fanouts);

}  // namespace zerocopy
