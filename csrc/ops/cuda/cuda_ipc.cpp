// CUDA IPC of device memory without torch's per-share bookkeeping (`zerocopy::cuda_ipc_handle`,
// `zerocopy::cuda_ipc_open`). Compiled only in CUDA builds.
//
// torch.multiprocessing shares a CUDA tensor by exporting its allocation *and* creating an interprocess CUDA event
// plus a reference-counter file for it. The driver backs each such event with a /dev/shm/cuda.shm.* file and torch
// names the counter file /dev/shm/torch_<pid>_*, and neither is removed when the exporting process is killed; the
// counter also makes torch print "Producer process has been terminated before all shared CUDA tensors released"
// at an exit where any consumer still counts. A memory handle alone needs neither: the exporter keeps the memory
// alive by protocol (see lightning_zerocopy/graph/cuda_ipc.py).
//
// Opening maps the allocation into the context of the *reading* device with cudaIpcMemLazyEnablePeerAccess.
// Memory opened in the owner device's context (what torch's rebuild does) is not readable by kernels of another
// device, even with peer access enabled between the two: such reads fault with cudaErrorIllegalAddress.
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <torch/library.h>

#include <cstring>
#include <memory>
#include <string>
#include <tuple>

namespace zerocopy {
namespace {

constexpr int64_t kMaxHandleBytes = 4096;  // a legacy handle is 66 bytes, an expandable segment's a few hundred

std::tuple<at::Tensor, int64_t> cuda_ipc_handle_cuda(const at::Tensor& tensor) {
  TORCH_CHECK_VALUE(tensor.is_cuda(), "cuda_ipc_handle: `tensor` must be a CUDA tensor, got ", tensor.device());
  TORCH_CHECK_VALUE(tensor.is_contiguous(), "cuda_ipc_handle: `tensor` must be contiguous");
  TORCH_CHECK_VALUE(tensor.numel() > 0, "cuda_ipc_handle: `tensor` is empty; an empty tensor needs no export");
  const c10::cuda::CUDAGuard guard(tensor.device());
  // The caching allocator knows the block's base allocation (what a CUDA IPC handle names) and the block's offset
  // in it; the tensor may start further into its storage.
  void* storage_start = const_cast<void*>(tensor.storage().data());
  const c10::cuda::CUDACachingAllocator::ShareableHandle shared =
      c10::cuda::CUDACachingAllocator::shareIpcHandle(storage_start);
  at::Tensor handle = at::empty({static_cast<int64_t>(shared.handle.size())}, at::TensorOptions().dtype(at::kByte));
  std::memcpy(handle.data_ptr(), shared.handle.data(), shared.handle.size());
  const int64_t offset = static_cast<int64_t>(shared.offset) + tensor.storage_offset() * tensor.element_size();
  return {handle, offset};
}

at::Tensor cuda_ipc_open_impl(const at::Tensor& handle, int64_t offset, int64_t nbytes, at::Device device) {
  TORCH_CHECK_VALUE(handle.device().is_cpu() && handle.scalar_type() == at::kByte && handle.dim() == 1,
                    "cuda_ipc_open: `handle` must be a 1-D uint8 CPU tensor (from cuda_ipc_handle)");
  TORCH_CHECK_VALUE(handle.numel() > 0 && handle.numel() <= kMaxHandleBytes, "cuda_ipc_open: `handle` has ",
                    handle.numel(), " bytes, which is no CUDA IPC handle");
  TORCH_CHECK_VALUE(offset >= 0, "cuda_ipc_open: `offset` must be >= 0, got ", offset);
  TORCH_CHECK_VALUE(nbytes > 0, "cuda_ipc_open: `nbytes` must be > 0, got ", nbytes);
  TORCH_CHECK_VALUE(device.is_cuda() && device.has_index(),
                    "cuda_ipc_open: `device` must be a CUDA device with an index, got ", device);
  const at::Tensor bytes = handle.contiguous();
  std::string key(static_cast<const char*>(bytes.const_data_ptr()), static_cast<size_t>(bytes.numel()));
  const c10::cuda::CUDAGuard guard(device);
  // Opened (once per process and allocation; torch's allocator caches it) in `device`'s context, peer access
  // enabled on the way when the memory lives on another GPU; closed when the last tensor over it is freed.
  std::shared_ptr<void> base = c10::cuda::CUDACachingAllocator::getIpcDevPtr(std::move(key));
  void* data = static_cast<char*>(base.get()) + offset;
  return at::for_blob(data, {nbytes})
      .deleter([base](void*) mutable { base.reset(); })
      .options(at::TensorOptions().dtype(at::kByte).device(device))
      .target_device(device)
      .make_tensor();
}

}  // namespace

// cuda_ipc_handle takes a CUDA tensor; cuda_ipc_open takes the handle's CPU bytes (and names the reading device),
// so its kernel is registered for the CPU key, in this CUDA-only file: a CPU build has neither.
TORCH_LIBRARY_IMPL(zerocopy, CUDA, m) { m.impl("cuda_ipc_handle", &cuda_ipc_handle_cuda); }
TORCH_LIBRARY_IMPL(zerocopy, CPU, m) { m.impl("cuda_ipc_open", &cuda_ipc_open_impl); }

}  // namespace zerocopy
