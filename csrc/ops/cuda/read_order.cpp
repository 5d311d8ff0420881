// See read_order.h.
#include "ops/cuda/read_order.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/clamp.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/sort.h>
#include <ATen/ops/where.h>

#include <tuple>

namespace zerocopy::cuda {

ReadOrder read_order(const at::Tensor& ids, bool by_address, const std::optional<at::Tensor>& location,
                     int64_t num_rows) {
  const int64_t n = ids.numel();
  if (n < 2 || num_rows < 1 || (!by_address && !location.has_value())) return {ids, at::Tensor()};
  if (!location.has_value()) {
    auto sorted = at::sort(ids);
    return {std::get<0>(sorted).contiguous(), std::get<1>(sorted).contiguous()};
  }
  // Sort key: the row's place within its part (its id, or its batch position), plus an offset that puts every
  // cached row after every host row. Ids out of range are clamped for the lookup and the key only.
  const at::Tensor ids64 = ids.to(at::kLong);
  const at::Tensor cached = location->index_select(0, ids64.clamp(0, num_rows - 1)).ge(0);
  at::Tensor key;
  if (by_address) {
    const at::Tensor place = ids64.clamp(-1, num_rows);
    key = at::where(cached, place.add(num_rows + 2), place);
  } else {
    const at::Tensor place = at::arange(n, ids64.options());
    key = at::where(cached, place.add(n), place);
  }
  const at::Tensor positions = std::get<1>(at::sort(key)).contiguous();
  return {ids.index_select(0, positions).contiguous(), positions};
}

}  // namespace zerocopy::cuda
