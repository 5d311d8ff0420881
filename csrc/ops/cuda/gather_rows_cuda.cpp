// CUDA glue of `zerocopy::gather_rows_into`: argument checks, device pointers, the reading order (read_order.h)
// and hot-row cache, the launch on the current CUDA stream, and the id check (one 8-byte read-back per call).
//
// `table` may be a CUDA tensor or a CPU tensor whose memory is pinned and mapped (zero-copy: the kernel reads
// host memory over PCIe); `ids` and `out` are CUDA tensors on one device.
#include <c10/cuda/CUDAStream.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <optional>

#include "ops/checks.h"
#include "ops/cuda/device_access.h"
#include "ops/cuda/gather_rows_kernel.cuh"
#include "ops/cuda/read_order.h"
#include "ops/gather_rows.h"

namespace zerocopy {
namespace {

void check_cuda_tensor(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK_VALUE(t.device().is_cuda(), op, ": `", name, "` must be a CUDA tensor here, got ", t.device());
}

void gather_rows_into_cuda(const at::Tensor& table, const at::Tensor& ids, const at::Tensor& out, bool sort_ids,
                           const std::optional<at::Tensor>& cache_slot, const std::optional<at::Tensor>& cache) {
  const char* op = kGatherRows;
  check_gather_rows_args(table, ids, out, cache_slot, cache);
  check_cuda_tensor(ids, op, "ids");
  check_cuda_tensor(out, op, "out");
  const int device = ids.device().index();
  TORCH_CHECK_VALUE(out.device() == ids.device(), op, ": `out` is on ", out.device(), " but `ids` is on ",
                    ids.device(), "; both must be on one GPU");
  c10::cuda::CUDAGuard guard(ids.device());
  const int64_t n = ids.numel();
  const int64_t row_bytes = gather_row_bytes(table);
  if (n == 0 || row_bytes == 0) return;

  cuda::GatherArgs args;
  args.table = cuda::device_readable_pointer(table, device, op, "table");
  args.num_rows = table.size(0);
  args.row_bytes = row_bytes;
  args.out = out.data_ptr();
  args.n = n;

  if (cache_slot.has_value()) {
    const at::Tensor& slot = *cache_slot;
    const at::Tensor& rows = *cache;
    TORCH_CHECK_VALUE(slot.device() == ids.device() && rows.device() == ids.device(), op,
                      ": `cache_slot` and `cache` must be on the GPU of `ids` (", ids.device(), ")");
    args.cache_slot = slot.const_data_ptr<int32_t>();
    args.cache = rows.const_data_ptr();
  }

  const cuda::ReadOrder order = cuda::read_order(ids, sort_ids);
  if (order.positions.defined()) args.out_pos = order.positions.const_data_ptr<int64_t>();
  args.ids = order.ids.const_data_ptr();
  args.ids_int64 = order.ids.scalar_type() == at::kLong;

  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
  at::Tensor bad = at::empty({1}, ids.options().dtype(at::kLong));
  args.bad_position = reinterpret_cast<unsigned long long*>(bad.data_ptr<int64_t>());
  cuda::check_cuda(cudaMemsetAsync(bad.data_ptr(), 0xFF, sizeof(int64_t), stream), op, "clearing the id check");
  cuda::check_cuda(cuda::launch_gather_rows(args, stream), op, "launching the gather kernel");

  unsigned long long first_bad = cuda::kNoBadId;
  cuda::check_cuda(cudaMemcpyAsync(&first_bad, bad.const_data_ptr(), sizeof(first_bad), cudaMemcpyDeviceToHost,
                                   stream),
                   op, "reading the id check");
  cuda::check_cuda(cudaStreamSynchronize(stream), op, "the gather kernel");
  if (first_bad != cuda::kNoBadId) {
    // Name the first bad id and its position exactly as the CPU op does; no bad row was read or written.
    check_ids_in_range(ids.cpu(), table.size(0), op, "ids", kGatherRowsBound);
    TORCH_CHECK_INDEX(false, op, ": `ids` holds a row id out of range for a `table` of ", table.size(0), " rows");
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(zerocopy, CUDA, m) { m.impl("gather_rows_into", &gather_rows_into_cuda); }

}  // namespace zerocopy
