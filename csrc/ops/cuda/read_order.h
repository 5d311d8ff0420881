// The order in which the zero-copy gathers read their rows (host-side glue, CUDA builds only).
//
// A gather kernel reads `ids[i]` and writes the row to `out[positions[i]]` (or `out[i]` when `positions` is
// undefined), so any permutation of the ids is free to choose. Address order (ascending ids) makes consecutive
// reads of host rows share pages and translation entries. Putting a feature cache's host rows before its cached
// ones was measured and made the gather slower (docs/BENCHMARK_NOTES.md, "host rows first"), so it is not done.
#pragma once

#include <ATen/core/Tensor.h>

namespace zerocopy::cuda {

struct ReadOrder {
  at::Tensor ids;        // the ids in reading order (`ids` itself when nothing is reordered)
  at::Tensor positions;  // int64 batch position of each read, or undefined for batch order
};

// The reading order of `ids` (CUDA, int32/int64): ascending ids when `by_address`, else batch order.
ReadOrder read_order(const at::Tensor& ids, bool by_address);

}  // namespace zerocopy::cuda
