// See read_order.h.
#include "ops/cuda/read_order.h"

#include <ATen/ops/sort.h>

#include <tuple>

namespace zerocopy::cuda {

ReadOrder read_order(const at::Tensor& ids, bool by_address) {
  if (!by_address || ids.numel() < 2) return {ids, at::Tensor()};
  auto sorted = at::sort(ids);
  return {std::get<0>(sorted).contiguous(), std::get<1>(sorted).contiguous()};
}

}  // namespace zerocopy::cuda
