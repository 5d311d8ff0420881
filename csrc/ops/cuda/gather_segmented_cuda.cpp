// CUDA glue of `zerocopy::gather_segmented_into`: argument checks, device pointers (registered host table, local
// and peer segments, peer access enabled once per device pair), the launch on the current CUDA stream, and the
// id/lookup check (one 16-byte read-back per call, as the other gathers do).
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <mutex>
#include <optional>
#include <set>
#include <utility>

#include "ops/checks.h"
#include "ops/cuda/device_access.h"
#include "ops/cuda/gather_segmented_kernel.cuh"
#include "ops/cuda/read_order.h"
#include "ops/gather_segmented.h"

namespace zerocopy {
namespace {

constexpr const char* kOp = "gather_segmented_into";

void check_on(const at::Tensor& t, const at::Device& device, const char* name) {
  TORCH_CHECK_VALUE(t.device() == device, kOp, ": `", name, "` is on ", t.device(), " but `ids` is on ", device,
                    "; both must be on one GPU");
}

// Lets kernels on `device` read memory of `peer` (cudaDeviceEnablePeerAccess, once per pair and process).
// False when the hardware cannot.
bool enable_peer_access(int device, int peer) {
  static std::mutex mutex;
  static std::set<std::pair<int, int>> enabled;
  std::lock_guard<std::mutex> lock(mutex);
  if (enabled.count({device, peer}) != 0) return true;
  int can = 0;
  cuda::check_cuda(cudaDeviceCanAccessPeer(&can, device, peer), kOp, "querying peer access");
  if (can == 0) return false;
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  const cudaError_t status = cudaDeviceEnablePeerAccess(peer, 0);
  if (status == cudaErrorPeerAccessAlreadyEnabled) {
    (void)cudaGetLastError();  // someone else (torch's peer copies) enabled it already
  } else {
    cuda::check_cuda(status, kOp, "enabling peer access");
  }
  enabled.insert({device, peer});
  return true;
}

void gather_segmented_into_cuda(const at::Tensor& table, const at::Tensor& ids, const at::Tensor& out,
                                const at::Tensor& location, int64_t slot_bits, at::TensorList segments,
                                const std::optional<at::Tensor>& counts, bool sort_ids) {
  check_gather_segmented_args(table, ids, out, location, slot_bits, segments, counts);
  TORCH_CHECK_VALUE(ids.device().is_cuda(), kOp, ": `ids` must be a CUDA tensor here, got ", ids.device());
  const at::Device device = ids.device();
  const int device_index = device.index();
  check_on(out, device, "out");
  check_on(location, device, "location");
  if (counts.has_value()) check_on(*counts, device, "counts");
  c10::cuda::CUDAGuard guard(device);

  cuda::SegmentedGatherArgs args;
  args.num_rows = table.size(0);
  args.row_bytes = table.size(1) * static_cast<int64_t>(table.element_size());
  args.n = ids.numel();
  args.num_segments = static_cast<int>(segments.size());
  for (size_t s = 0; s < segments.size(); ++s) {
    const at::Tensor& seg = segments[s];
    TORCH_CHECK_VALUE(seg.device().is_cuda(), kOp, ": `segments[", s, "]` must be a CUDA tensor, got ", seg.device());
    const int seg_device = seg.device().index();
    if (seg_device != device_index && seg.numel() > 0) {
      TORCH_CHECK_VALUE(enable_peer_access(device_index, seg_device), kOp, ": `segments[", s, "]` is on ",
                        seg.device(), ", which ", device,
                        " cannot read (no peer access between the two GPUs); keep every shard on a GPU that "
                        "peers with the gathering one, or use the replicate policy");
    }
    args.segments[s] = seg.const_data_ptr();
    args.segment_rows[s] = seg.size(0);
  }
  if (args.n == 0 || args.row_bytes == 0) return;
  args.table = cuda::device_readable_pointer(table, device_index, kOp, "table");
  const cuda::ReadOrder order = cuda::read_order(ids, sort_ids);
  const at::Tensor& positions = order.positions;
  if (positions.defined()) args.out_pos = positions.const_data_ptr<int64_t>();
  args.ids = order.ids.const_data_ptr();
  args.ids_int64 = order.ids.scalar_type() == at::kLong;
  args.location = location.const_data_ptr();
  args.location_int64 = location.scalar_type() == at::kLong;
  args.slot_bits = static_cast<int>(slot_bits);
  args.out = out.data_ptr();
  if (counts.has_value()) {
    args.counts = reinterpret_cast<unsigned long long*>(counts->data_ptr<int64_t>());
  }

  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device_index).stream();
  at::Tensor bad = at::empty({2}, ids.options().dtype(at::kLong));
  auto* bad_slots = reinterpret_cast<unsigned long long*>(bad.data_ptr<int64_t>());
  args.bad_id_position = bad_slots;
  args.bad_location_position = bad_slots + 1;
  cuda::check_cuda(cudaMemsetAsync(bad_slots, 0xFF, 2 * sizeof(unsigned long long), stream), kOp,
                   "clearing the id check");
  cuda::check_cuda(cuda::launch_gather_segmented(args, stream), kOp, "launching the gather kernel");
  unsigned long long first_bad[2] = {cuda::kNoBadPosition, cuda::kNoBadPosition};
  cuda::check_cuda(cudaMemcpyAsync(first_bad, bad_slots, sizeof(first_bad), cudaMemcpyDeviceToHost, stream), kOp,
                   "reading the id check");
  cuda::check_cuda(cudaStreamSynchronize(stream), kOp, "the gather kernel");
  if (first_bad[0] != cuda::kNoBadPosition) {
    // Name the first bad id and its position exactly as the CPU op does; no bad row was read or written.
    check_ids_in_range(ids.cpu(), table.size(0), kOp, "ids", "table.shape[0]");
    TORCH_CHECK_INDEX(false, kOp, ": `ids` holds a row id out of range for a `table` of ", table.size(0), " rows");
  }
  if (first_bad[1] != cuda::kNoBadPosition) {
    int64_t position = static_cast<int64_t>(first_bad[1]);
    if (positions.defined()) position = positions.select(0, position).item<int64_t>();  // back to batch order
    const int64_t id = ids.cpu().to(at::kLong).const_data_ptr<int64_t>()[position];
    const int64_t code = location.select(0, id).cpu().to(at::kLong).item<int64_t>();
    TORCH_CHECK_VALUE(false, kOp, ": `location` entry ", code, " of row ", id, " (position ", position,
                      " of `ids`) names segment ", code >> slot_bits, " slot ", code & ((int64_t{1} << slot_bits) - 1),
                      ", which does not exist (", segments.size(), " segment(s)); that row was not read");
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(zerocopy, CUDA, m) { m.impl("gather_segmented_into", &gather_segmented_into_cuda); }

}  // namespace zerocopy
