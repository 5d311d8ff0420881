// Device helpers shared by the row-copy kernels: the vector type of a V-byte access, the widest access that
// the row width and the pointers' alignment allow, the threads per row, and the copy of a batch of rows with
// several reads in flight. No torch headers (plain nvcc).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace zerocopy::cuda {

template <int V>
struct RowVec;
template <>
struct RowVec<16> {
  using type = uint4;
};
template <>
struct RowVec<8> {
  using type = uint2;
};
template <>
struct RowVec<4> {
  using type = unsigned int;
};
template <>
struct RowVec<2> {
  using type = unsigned short;
};
template <>
struct RowVec<1> {
  using type = unsigned char;
};

// The widest access (16, 8, 4, 2 or 1 bytes) dividing every bit pattern OR-ed into `bits` (row width and
// base pointers).
inline int widest_access(uint64_t bits) {
  for (int v = 16; v > 1; v /= 2) {
    if ((bits & static_cast<uint64_t>(v - 1)) == 0) return v;
  }
  return 1;
}

// log2 of the threads that copy one row: the smallest power of two covering `vectors` accesses, at most a warp.
inline int log2_threads_per_row(int64_t vectors) {
  int log2 = 0;
  while (log2 < 5 && (int64_t{1} << log2) < vectors) ++log2;
  return log2;
}

// Copies R rows (src[k] -> dst[k], nullptr = skip) of `vectors` T-sized vectors with the `group_size` threads of
// a row group, this thread being `lane`: U vectors per row in flight, every load of the step issued before its
// first store (a read over PCIe or NVLink waits long; bandwidth comes from the reads outstanding).
template <typename T, int R, int U>
__device__ __forceinline__ void copy_rows_in_flight(const T* const (&src)[R], T* const (&dst)[R], int lane,
                                                    int group_size, int64_t vectors) {
  for (int64_t c = lane; c < vectors; c += static_cast<int64_t>(group_size) * U) {
    T v[R][U];
#pragma unroll
    for (int k = 0; k < R; ++k) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t at = c + static_cast<int64_t>(u) * group_size;
        if (src[k] != nullptr && at < vectors) v[k][u] = src[k][at];
      }
    }
#pragma unroll
    for (int k = 0; k < R; ++k) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t at = c + static_cast<int64_t>(u) * group_size;
        if (src[k] != nullptr && at < vectors) dst[k][at] = v[k][u];
      }
    }
  }
}

// Multiprocessors of the current device (132, an H100/H200, if it cannot be read).
inline int current_multiprocessors() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 132;
  int count = 0;
  if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || count <= 0) {
    return 132;
  }
  return count;
}

}  // namespace zerocopy::cuda
