// The CUDA sampler's process-wide switches and counters as ops of the `zerocopy` library (schemas in
// csrc/library.cpp), so they bind to Python through the dispatcher like every other op. They take no tensors, so
// their kernels register under CompositeExplicitAutograd, which the dispatcher runs for an op without tensor
// arguments. CUDA builds only (the state lives in sample_neighbors_lean.cpp and sample_neighbors_lean_graph.cpp).
#include <torch/library.h>

#include <cstdint>
#include <vector>

#include "ops/cuda/sample_neighbors/sample_neighbors_glue.h"

namespace zerocopy {
namespace {

bool set_lean_sampler(bool enabled) { return set_lean_sampler_enabled(enabled); }

bool set_sampler_graphs(bool enabled) { return set_sampler_graphs_enabled(enabled); }

std::vector<int64_t> graph_stats() {
  const SamplerGraphStats s = sampler_graph_stats();
  return {s.captures, s.replays, s.failures, s.evictions, s.cached};
}

}  // namespace

TORCH_LIBRARY_IMPL(zerocopy, CompositeExplicitAutograd, m) {
  m.impl("set_lean_sampler", &set_lean_sampler);
  m.impl("set_sampler_graphs", &set_sampler_graphs);
  m.impl("sampler_graph_stats", &graph_stats);
}

}  // namespace zerocopy
