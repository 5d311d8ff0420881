// The draw of one negative node id, shared by the CPU kernel and the CUDA kernel of `zerocopy::negative_nodes`.
//
// No torch headers (the .cu kernel includes it): a pure function of (seed, endpoint, position) and the weights.
// Uniform over [0, num_nodes) without weights; with `cum_weight` (float64 inclusive prefix sums of per-node
// weights) node v is drawn with probability weight[v] / total by inverse CDF: the first v with
// cum_weight[v] > u * total, u uniform in [0, 1) from 53 random bits.
#pragma once

#include <cstdint>

#include "ops/random.h"

namespace zerocopy {

// The hop slot of rng::stream_key reserved for negatives (sampling uses hops 0 .. len(fanouts) - 1):
// endpoint 0 (source) and 1 (destination) get distinct streams.
inline constexpr uint64_t kNegativeHopBase = 0x6E65670000000000ull;

ZEROCOPY_HOST_DEVICE double exact_product(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);  // never contracted into an FMA: the CPU rounds the same product the same way
#else
  return a * b;
#endif
}

ZEROCOPY_HOST_DEVICE int64_t draw_negative(uint64_t seed, uint64_t endpoint, uint64_t position, int64_t num_nodes,
                                           const double* cum_weight) {
  rng::Stream stream(rng::stream_key(seed, kNegativeHopBase + endpoint, position));
  if (cum_weight == nullptr) return static_cast<int64_t>(stream.below(static_cast<uint64_t>(num_nodes)));
  const double total = cum_weight[num_nodes - 1];
  const double u = static_cast<double>(stream.next() >> 11) * 0x1.0p-53;  // exact: a power-of-two scale
  const double target = exact_product(u, total);
  int64_t lo = 0, hi = num_nodes - 1;  // the first index with cum_weight[index] > target (the last at worst)
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (cum_weight[mid] > target) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

}  // namespace zerocopy
