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

// A CSC (`indptr` int64 with num_nodes + 1 >= 1 entries, `indices` int32 or int64) and the int64 node ids an op
// starts from (`nodes`, named `nodes_name`): each 1-D and contiguous. Devices are the caller's to check.
inline void check_csc_and_nodes(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& nodes,
                                const char* op, const char* nodes_name) {
  check_dtype(indptr, at::kLong, op, "indptr");
  check_index_dtype(indices, op, "indices");
  check_dtype(nodes, at::kLong, op, nodes_name);
  check_dim(indptr, 1, op, "indptr");
  check_dim(indices, 1, op, "indices");
  check_dim(nodes, 1, op, nodes_name);
  check_contiguous(indptr, op, "indptr");
  check_contiguous(indices, op, "indices");
  check_contiguous(nodes, op, nodes_name);
  TORCH_CHECK_VALUE(indptr.numel() >= 1, op, ": `indptr` must have num_nodes + 1 >= 1 entries, got none");
}

// Every id of `ids` (a CPU int32/int64 tensor, contiguous) lies in [0, bound); otherwise IndexError naming
// `name`, the first offending id and its position, and `bound_name` (e.g. "num_nodes"). The one id range check
// of every op: a parallel scan, then a sequential search for the first bad id only when there is one.
void check_ids_in_range(const at::Tensor& ids, int64_t bound, const char* op, const char* name,
                        const char* bound_name);

}  // namespace zerocopy
