// CUDA kernel of `zerocopy::gather_rows_into`: out[pos(i)] = table[ids[i]], row bytes copied as vectors.
//
// Shape of the work: a group of G threads (G a power of two <= 32, the smallest that covers the row in one
// pass of V-byte vectors, capped at a warp) copies a row; every thread keeps R rows x U vectors in flight
// (all loads issued before the first store), which is what a read over PCIe needs: each load waits a
// microsecond or more, so bandwidth comes from the number of loads outstanding, not from arithmetic.
// Rows wider than G * V bytes are walked in G * V * U byte steps by the same group.
#include "ops/cuda/gather_rows_kernel.cuh"
#include "ops/cuda/row_vectors.cuh"

namespace zerocopy::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kRowsInFlight = 4;     // R
constexpr int kVectorsInFlight = 2;  // U (per row, for rows wider than one group pass)

struct Params {
  const char* table;
  unsigned long long num_rows;
  int64_t row_bytes;
  const void* ids;
  const int64_t* out_pos;
  const int32_t* cache_slot;
  const char* cache;
  char* out;
  int64_t n;
  unsigned long long* bad_position;
};

template <int V, typename IdT>
__global__ void __launch_bounds__(kThreads) gather_rows_kernel(const Params p, const int log2_group) {
  using T = typename RowVec<V>::type;
  const int group_size = 1 << log2_group;
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int lane = static_cast<int>(thread & (group_size - 1));
  const int64_t group = thread >> log2_group;
  const int64_t num_groups = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> log2_group;
  const int64_t vectors = p.row_bytes / V;
  const IdT* ids = static_cast<const IdT*>(p.ids);

  for (int64_t first = group; first < p.n; first += num_groups * kRowsInFlight) {
    const T* src[kRowsInFlight];
    T* dst[kRowsInFlight];
#pragma unroll
    for (int k = 0; k < kRowsInFlight; ++k) {
      const int64_t i = first + k * num_groups;
      src[k] = nullptr;
      dst[k] = nullptr;
      if (i < p.n) {
        const int64_t id = static_cast<int64_t>(ids[i]);
        if (static_cast<unsigned long long>(id) >= p.num_rows) {
          // A bad id is never dereferenced; the host raises naming the first bad position.
          if (lane == 0) atomicMin(p.bad_position, static_cast<unsigned long long>(i));
        } else {
          const int32_t slot = p.cache_slot != nullptr ? p.cache_slot[id] : -1;
          const char* row = slot >= 0 ? p.cache + static_cast<int64_t>(slot) * p.row_bytes
                                      : p.table + id * p.row_bytes;
          const int64_t to = p.out_pos != nullptr ? p.out_pos[i] : i;
          src[k] = reinterpret_cast<const T*>(row);
          dst[k] = reinterpret_cast<T*>(p.out + to * p.row_bytes);
        }
      }
    }
    copy_rows_in_flight<T, kRowsInFlight, kVectorsInFlight>(src, dst, lane, group_size, vectors);
  }
}

int vector_bytes_for(const GatherArgs& a) {
  uint64_t bits = static_cast<uint64_t>(a.row_bytes) | reinterpret_cast<uintptr_t>(a.table) |
                  reinterpret_cast<uintptr_t>(a.out);
  if (a.cache != nullptr) bits |= reinterpret_cast<uintptr_t>(a.cache);
  return widest_access(bits);
}

template <int V, typename IdT>
cudaError_t launch(const Params& p, int log2_group, cudaStream_t stream) {
  const int64_t groups_needed = (p.n + kRowsInFlight - 1) / kRowsInFlight;
  const int64_t threads_needed = groups_needed << log2_group;
  int64_t blocks = (threads_needed + kThreads - 1) / kThreads;
  // Enough blocks to fill every multiprocessor several times over; the grid-stride loop covers the rest.
  const int64_t max_blocks = static_cast<int64_t>(current_multiprocessors()) * 32;
  if (blocks > max_blocks) blocks = max_blocks;
  if (blocks < 1) blocks = 1;
  gather_rows_kernel<V, IdT><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p, log2_group);
  return cudaGetLastError();
}

template <typename IdT>
cudaError_t launch_typed(const Params& p, int v, int log2_group, cudaStream_t stream) {
  switch (v) {
    case 16:
      return launch<16, IdT>(p, log2_group, stream);
    case 8:
      return launch<8, IdT>(p, log2_group, stream);
    case 4:
      return launch<4, IdT>(p, log2_group, stream);
    case 2:
      return launch<2, IdT>(p, log2_group, stream);
    default:
      return launch<1, IdT>(p, log2_group, stream);
  }
}

}  // namespace

cudaError_t launch_gather_rows(const GatherArgs& args, cudaStream_t stream) {
  if (args.n <= 0 || args.row_bytes <= 0) return cudaSuccess;
  const int v = vector_bytes_for(args);
  const int log2_group = log2_threads_per_row(args.row_bytes / v);
  Params p;
  p.table = static_cast<const char*>(args.table);
  p.num_rows = static_cast<unsigned long long>(args.num_rows);
  p.row_bytes = args.row_bytes;
  p.ids = args.ids;
  p.out_pos = args.out_pos;
  p.cache_slot = args.cache_slot;
  p.cache = static_cast<const char*>(args.cache);
  p.out = static_cast<char*>(args.out);
  p.n = args.n;
  p.bad_position = args.bad_position;
  return args.ids_int64 ? launch_typed<int64_t>(p, v, log2_group, stream)
                        : launch_typed<int32_t>(p, v, log2_group, stream);
}

}  // namespace zerocopy::cuda
