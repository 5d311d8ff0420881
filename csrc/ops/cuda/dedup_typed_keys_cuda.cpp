// CUDA glue of `zerocopy::dedup_typed_keys`: a hash table in a workspace from PyTorch's caching allocator, four
// kernels and a prefix sum (at::cumsum) on the current stream, one read-back (the reports and the per-type counts,
// whose sum is the number of new keys) and so one synchronization of that stream per call.
#include <ATen/ops/cumsum.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "ops/cuda/dedup_typed_keys_kernel.cuh"
#include "ops/cuda/device_access.h"
#include "ops/dedup_typed_keys.h"

namespace zerocopy {
namespace {

constexpr const char* kOp = kDedupTypedKeys;
constexpr int64_t kMinCapacity = 1024;

int64_t table_capacity(int64_t keys) {
  int64_t capacity = kMinCapacity;
  while (capacity < 2 * keys) capacity *= 2;
  return capacity;
}

DedupedKeys dedup_typed_keys_cuda(const at::Tensor& existing_keys, const at::Tensor& candidate_keys,
                                  int64_t num_types) {
  check_dedup_typed_keys_args(existing_keys, candidate_keys, num_types);
  TORCH_CHECK_VALUE(candidate_keys.device().is_cuda(), kOp, ": `candidate_keys` must be a CUDA tensor, got ",
                    candidate_keys.device());
  const int64_t num_existing = existing_keys.numel();
  const int64_t num_candidates = candidate_keys.numel();
  if (num_candidates == 0) {
    return {candidate_keys.new_empty({0}), candidate_keys.new_empty({0}), at::zeros({num_types}, at::kLong)};
  }
  c10::cuda::CUDAGuard guard(candidate_keys.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(candidate_keys.device().index()).stream();
  const at::TensorOptions opts = candidate_keys.options();
  const int64_t n = num_existing + num_candidates;
  const int64_t capacity = table_capacity(n);

  // one workspace: [table keys | table first positions | status | per-type counts]; the last two are read back
  at::Tensor workspace = at::empty({2 * capacity + cuda::kDedupStatusSlots + num_types}, opts);
  int64_t* base = workspace.data_ptr<int64_t>();
  cuda::KeyTable table;
  table.keys = reinterpret_cast<long long*>(base);
  table.first = reinterpret_cast<long long*>(base + capacity);
  table.capacity = capacity;
  long long* status = reinterpret_cast<long long*>(base + 2 * capacity);
  long long* counts = status + cuda::kDedupStatusSlots;
  cuda::check_cuda(cudaMemsetAsync(table.keys, 0xFF, capacity * sizeof(int64_t), stream), kOp, "clearing the table");
  cuda::check_cuda(cudaMemsetAsync(table.first, 0x7F, (capacity + cuda::kDedupStatusSlots) * sizeof(int64_t), stream),
                   kOp, "clearing the first positions");
  cuda::check_cuda(cudaMemsetAsync(counts, 0, num_types * sizeof(int64_t), stream), kOp, "clearing the counts");

  at::Tensor slot = at::empty({n}, opts);
  at::Tensor flags = at::empty({num_candidates}, opts);
  at::Tensor incl = at::empty({num_candidates}, opts);
  at::Tensor new_keys = at::empty({num_candidates}, opts);
  at::Tensor local = at::empty({num_candidates}, opts);
  const int64_t* existing = existing_keys.const_data_ptr<int64_t>();
  const int64_t* candidates = candidate_keys.const_data_ptr<int64_t>();
  cuda::check_cuda(cuda::launch_insert_keys(existing, num_existing, candidates, num_candidates, table,
                                            slot.data_ptr<int64_t>(), status, stream),
                   kOp, "launching insert_keys");
  cuda::check_cuda(cuda::launch_flag_first(num_existing, num_candidates, slot.const_data_ptr<int64_t>(), table,
                                           flags.data_ptr<int64_t>(), status, stream),
                   kOp, "launching flag_first");
  at::cumsum_out(incl, flags, 0);
  cuda::check_cuda(cuda::launch_compact_new(candidates, num_existing, num_candidates, slot.const_data_ptr<int64_t>(),
                                            table, incl.const_data_ptr<int64_t>(), num_types,
                                            new_keys.data_ptr<int64_t>(), local.data_ptr<int64_t>(), counts, stream),
                   kOp, "launching compact_new");

  std::vector<int64_t> host(cuda::kDedupStatusSlots + num_types);
  cuda::check_cuda(cudaMemcpyAsync(host.data(), status, host.size() * sizeof(int64_t), cudaMemcpyDeviceToHost,
                                   stream),
                   kOp, "reading back the counts");
  cuda::check_cuda(cudaStreamSynchronize(stream), kOp, "the deduplication kernels");
  const int64_t negative = host[cuda::kDedupNegative];
  if (negative != cuda::kNoPosition) {
    const at::Tensor& holder = negative < num_existing ? existing_keys : candidate_keys;
    const int64_t index = negative < num_existing ? negative : negative - num_existing;
    raise_negative_key(negative, num_existing, holder.narrow(0, index, 1).item<int64_t>());
  }
  const int64_t repeated = host[cuda::kDedupRepeated];
  if (repeated != cuda::kNoPosition) {
    raise_repeated_existing_key(repeated, existing_keys.narrow(0, repeated, 1).item<int64_t>());
  }
  at::Tensor type_counts = at::empty({num_types}, at::kLong);
  std::memcpy(type_counts.data_ptr<int64_t>(), host.data() + cuda::kDedupStatusSlots, num_types * sizeof(int64_t));
  const int64_t fresh = std::accumulate(host.begin() + cuda::kDedupStatusSlots, host.end(), int64_t{0});
  return {new_keys.narrow(0, 0, fresh), local, type_counts};
}

}  // namespace

TORCH_LIBRARY_IMPL(zerocopy, CUDA, m) { m.impl("dedup_typed_keys", &dedup_typed_keys_cuda); }

}  // namespace zerocopy
