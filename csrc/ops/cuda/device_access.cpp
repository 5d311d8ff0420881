// Host-side helpers of the CUDA glue (see device_access.h). Compiled only in CUDA builds.
#include "ops/cuda/device_access.h"

#include <c10/util/Exception.h>

#include <algorithm>

namespace zerocopy::cuda {
namespace {

constexpr int64_t kProbeStride = int64_t{1} << 30;  // check the mapping once per GiB of the range

// The device alias of registered host address `p`, or nullptr when `p` is not registered/pinned host memory.
const char* mapped_alias(const char* p) {
  cudaPointerAttributes attr{};
  const cudaError_t status = cudaPointerGetAttributes(&attr, p);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky-free error so later launches do not report it
    return nullptr;
  }
  if (attr.type != cudaMemoryTypeHost || attr.devicePointer == nullptr) return nullptr;
  return static_cast<const char*>(attr.devicePointer);
}

// Device alias of the host range [p, p + nbytes), or nullptr unless every probed byte is registered and the
// aliases are contiguous (so the kernel may index the range from the alias of its first byte).
const char* mapped_range(const char* p, int64_t nbytes) {
  const char* base = mapped_alias(p);
  if (base == nullptr) return nullptr;
  for (int64_t off = kProbeStride; off < nbytes; off += kProbeStride) {
    if (mapped_alias(p + off) != base + off) return nullptr;
  }
  if (nbytes > 1 && mapped_alias(p + nbytes - 1) != base + nbytes - 1) return nullptr;
  return base;
}

int64_t storage_span_bytes(const at::Tensor& t) {
  // Bytes from the first to one past the last element a contiguous tensor covers.
  return t.numel() * static_cast<int64_t>(t.element_size());
}

}  // namespace

void check_cuda(cudaError_t status, const char* op, const char* what) {
  if (status == cudaSuccess) return;
  (void)cudaGetLastError();
  TORCH_CHECK(false, op, ": ", what, " failed: ", cudaGetErrorString(status), " (cudaError ",
              static_cast<int>(status), ")");
}

bool is_registered_host(const at::Tensor& t) {
  if (!t.device().is_cpu()) return false;
  const int64_t nbytes = storage_span_bytes(t);
  if (nbytes == 0) return true;
  return mapped_range(static_cast<const char*>(t.const_data_ptr()), nbytes) != nullptr;
}

const void* device_readable_pointer(const at::Tensor& t, int device_index, const char* op, const char* name) {
  if (t.device().is_cuda()) {
    TORCH_CHECK_VALUE(t.device().index() == device_index, op, ": `", name, "` is on ", t.device(),
                      " but the other tensors are on cuda:", device_index, "; move it to that device");
    return t.const_data_ptr();
  }
  TORCH_CHECK_VALUE(t.device().is_cpu(), op, ": `", name, "` must be a CUDA tensor or registered host memory, got ",
                    t.device());
  const int64_t nbytes = storage_span_bytes(t);
  if (nbytes == 0) return t.const_data_ptr();
  const char* alias = mapped_range(static_cast<const char*>(t.const_data_ptr()), nbytes);
  TORCH_CHECK_VALUE(alias != nullptr, op, ": `", name,
                    "` is a CPU tensor whose memory is not pinned and mapped for CUDA, so the GPU cannot read it "
                    "(zero-copy). Register it first with lightning_zerocopy.graph.register_host_tensor(",
                    name, ") (cudaHostRegister with the mapped flag), use a pinned tensor (",
                    name, ".pin_memory()), or move it to the GPU");
  return alias;
}

}  // namespace zerocopy::cuda
