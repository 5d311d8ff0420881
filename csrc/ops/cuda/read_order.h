// The order in which the zero-copy gathers read their rows (host-side glue, CUDA builds only).
//
// A gather kernel reads `ids[i]` and writes the row to `out[positions[i]]` (or `out[i]` when `positions` is
// undefined), so any permutation of the ids is free to choose. Two choices matter on the GPU:
//  * address order: ascending ids, so consecutive reads of host rows share pages and translation entries;
//  * host rows first: when some rows are served from GPU memory (a feature cache), the rows that must cross
//    PCIe come first. A block lasts as long as its slowest row, so a block mixing cached and host rows keeps
//    only part of its reads in flight on the link; grouping the host rows keeps every block on the link full
//    while it runs, and the cached rows fill the tail.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

namespace zerocopy::cuda {

struct ReadOrder {
  at::Tensor ids;        // the ids in reading order (`ids` itself when nothing is reordered)
  at::Tensor positions;  // int64 batch position of each read, or undefined for batch order
};

// The reading order of `ids` (CUDA, int32/int64): ascending ids when `by_address`, and, when `location` is
// given (the feature cache's per-row lookup, < 0 for a row read from the host table of `num_rows` rows), every
// host row before every cached one, each part in address or batch order. Ids out of range keep a place (the
// kernel reports them); no memory outside `location` is read for them.
ReadOrder read_order(const at::Tensor& ids, bool by_address, const std::optional<at::Tensor>& location,
                     int64_t num_rows);

}  // namespace zerocopy::cuda
