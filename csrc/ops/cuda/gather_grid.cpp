// The gather kernels' process-wide grid bound (gather_grid.h), and its op `zerocopy::set_gather_blocks_per_sm`
// (schema in csrc/library.cpp; no tensor arguments, so it registers under CompositeExplicitAutograd). CUDA builds only.
#include "ops/cuda/gather_grid.h"

#include <torch/library.h>

#include <atomic>

namespace zerocopy {
namespace cuda {
namespace {
std::atomic<int64_t> blocks_per_multiprocessor{kDefaultGatherBlocksPerMultiprocessor};
}  // namespace

int64_t gather_blocks_per_multiprocessor() { return blocks_per_multiprocessor.load(std::memory_order_relaxed); }

int64_t set_gather_blocks_per_multiprocessor(int64_t blocks) {
  TORCH_CHECK_VALUE(blocks >= 1 && blocks <= 65536, "set_gather_blocks_per_sm: blocks must be in [1, 65536], got ",
                    blocks);
  return blocks_per_multiprocessor.exchange(blocks);
}
}  // namespace cuda

TORCH_LIBRARY_IMPL(zerocopy, CompositeExplicitAutograd, m) {
  m.impl("set_gather_blocks_per_sm", &cuda::set_gather_blocks_per_multiprocessor);
}

}  // namespace zerocopy
