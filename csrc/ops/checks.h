// Argument checks shared by every op. Each failure names the argument so the Python error says what to fix.
// TORCH_CHECK_VALUE raises ValueError, TORCH_CHECK_TYPE TypeError, TORCH_CHECK_INDEX IndexError.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

namespace zerocopy {

inline void check_dim(const at::Tensor& t, int64_t dim, const char* op, const char* name) {
  TORCH_CHECK_VALUE(t.dim() == dim, op, ": `", name, "` must be ", dim, "-D, got shape ", t.sizes());
}

inline void check_contiguous(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK_VALUE(t.is_contiguous(), op, ": `", name,
                    "` must be contiguous (call .contiguous() on it first)");
}

inline void check_index_dtype(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kLong || t.scalar_type() == at::kInt, op, ": `", name,
                   "` must be int64 or int32, got ", t.scalar_type());
}

inline void check_dtype(const at::Tensor& t, at::ScalarType dtype, const char* op, const char* name) {
  TORCH_CHECK_TYPE(t.scalar_type() == dtype, op, ": `", name, "` must be ", dtype, ", got ", t.scalar_type());
}

inline void check_cpu(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK_VALUE(t.device().is_cpu(), op, ": `", name, "` must be a CPU tensor, got ", t.device());
}

}  // namespace zerocopy
