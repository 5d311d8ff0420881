// Counter-based random numbers for the samplers, shared by the CPU kernels and (later) the CUDA kernels.
//
// No torch headers and no global state: a stream is a pure function of a 64-bit key and a counter, so each
// (batch seed, hop, target position) -- or, for node-keyed sampling, each (seed, hop, node id) -- gets its own
// independent stream and the sample does not depend on which thread (or CUDA thread) draws it, nor in which order.
#pragma once

#include <cstdint>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define ZEROCOPY_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define ZEROCOPY_HOST_DEVICE inline
#endif

namespace zerocopy::rng {

inline constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

// The splitmix64 finalizer: a bijective 64-bit mixer with full avalanche.
ZEROCOPY_HOST_DEVICE uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The key of the stream that serves target `position` of hop `hop` of the batch drawn with `seed`.
ZEROCOPY_HOST_DEVICE uint64_t stream_key(uint64_t seed, uint64_t hop, uint64_t position) {
  return mix64(mix64(mix64(seed) + (hop + 1) * kGolden) ^ (position * 0xD1B54A32D192ED03ull));
}

// The key of the stream that serves node `node` at hop `hop` of node-keyed sampling with `seed`: the same for that
// node in every batch (a separate domain from stream_key's, so the two never share a stream by accident).
ZEROCOPY_HOST_DEVICE uint64_t node_stream_key(uint64_t seed, uint64_t hop, uint64_t node) {
  constexpr uint64_t kNodeDomain = 0x6A09E667F3BCC909ull;
  return mix64(mix64(mix64(seed ^ kNodeDomain) + (hop + 1) * kGolden) ^ (node * 0xD1B54A32D192ED03ull));
}

// High 64 bits of the 128-bit product a * b.
ZEROCOPY_HOST_DEVICE uint64_t mul_high(uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH__)
  return __umul64hi(a, b);
#else
  return static_cast<uint64_t>((static_cast<unsigned __int128>(a) * b) >> 64);
#endif
}

// A splitmix64 stream: the i-th output is mix64(key + (i + 1) * kGolden).
class Stream {
 public:
  ZEROCOPY_HOST_DEVICE explicit Stream(uint64_t key) : state_(key) {}

  ZEROCOPY_HOST_DEVICE uint64_t next() {
    state_ += kGolden;
    return mix64(state_);
  }

  // Uniform integer in [0, bound) for bound > 0, without modulo bias (Lemire's multiply-shift with rejection).
  ZEROCOPY_HOST_DEVICE uint64_t below(uint64_t bound) {
    uint64_t x = next();
    uint64_t low = x * bound;
    if (low < bound) {
      const uint64_t threshold = (0 - bound) % bound;
      while (low < threshold) {
        x = next();
        low = x * bound;
      }
    }
    return mul_high(x, bound);
  }

 private:
  uint64_t state_;
};

}  // namespace zerocopy::rng
