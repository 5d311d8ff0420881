// CUDA kernel of `zerocopy::gather_segmented_into` (see gather_segmented_kernel.cuh).
//
// The work is shaped like the zero-copy row gather (gather_rows_kernel.cu): a group of G threads (a power of two
// <= 32) copies a row in V-byte vectors, and every thread keeps R rows x U vectors in flight, since each read of
// host memory (or a peer GPU over NVLink) waits a long time and bandwidth comes from reads outstanding. Before its
// rows are copied, each group resolves where they live with one lookup read per id. Rows served per source are
// counted in shared memory and added to the global counters once per block, so counting costs no host sync and
// one atomic per block and source.
#include "ops/cuda/gather_segmented_kernel.cuh"
#include "ops/cuda/row_vectors.cuh"

namespace zerocopy::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kRowsInFlight = 4;     // R
constexpr int kVectorsInFlight = 2;  // U

template <int V, typename IdT, typename LocT>
__global__ void __launch_bounds__(kThreads) gather_segmented_kernel(const SegmentedGatherArgs p, const int log2_group) {
  using T = typename RowVec<V>::type;
  __shared__ unsigned long long block_counts[kMaxSegments + 1];
  const bool counting = p.counts != nullptr;
  if (counting) {
    for (int s = threadIdx.x; s <= p.num_segments; s += blockDim.x) block_counts[s] = 0;
  }
  __syncthreads();

  const int group_size = 1 << log2_group;
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int lane = static_cast<int>(thread & (group_size - 1));
  const int64_t group = thread >> log2_group;
  const int64_t num_groups = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> log2_group;
  const int64_t vectors = p.row_bytes / V;
  const IdT* ids = static_cast<const IdT*>(p.ids);
  const LocT* location = static_cast<const LocT*>(p.location);
  const int64_t slot_mask = (int64_t{1} << p.slot_bits) - 1;
  const char* table = static_cast<const char*>(p.table);
  char* out = static_cast<char*>(p.out);

  for (int64_t first = group; first < p.n; first += num_groups * kRowsInFlight) {
    const T* src[kRowsInFlight];
    T* dst[kRowsInFlight];
#pragma unroll
    for (int k = 0; k < kRowsInFlight; ++k) {
      const int64_t i = first + k * num_groups;
      src[k] = nullptr;
      dst[k] = nullptr;
      if (i >= p.n) continue;
      const int64_t id = static_cast<int64_t>(ids[i]);
      if (static_cast<unsigned long long>(id) >= static_cast<unsigned long long>(p.num_rows)) {
        if (lane == 0) atomicMin(p.bad_id_position, static_cast<unsigned long long>(i));
        continue;  // never dereferenced; the host raises naming the first bad position
      }
      const int64_t code = static_cast<int64_t>(location[id]);
      const char* row = nullptr;
      int source = p.num_segments;  // the host table
      if (code < 0) {
        row = table + id * p.row_bytes;
      } else {
        const int64_t segment = code >> p.slot_bits;
        const int64_t slot = code & slot_mask;
        if (segment < p.num_segments && slot < p.segment_rows[segment]) {
          row = static_cast<const char*>(p.segments[segment]) + slot * p.row_bytes;
          source = static_cast<int>(segment);
        } else if (lane == 0) {
          atomicMin(p.bad_location_position, static_cast<unsigned long long>(i));
        }
      }
      if (row == nullptr) continue;
      src[k] = reinterpret_cast<const T*>(row);
      dst[k] = reinterpret_cast<T*>(out + (p.out_pos != nullptr ? p.out_pos[i] : i) * p.row_bytes);
      if (counting && lane == 0) atomicAdd(&block_counts[source], 1ull);
    }
    copy_rows_in_flight<T, kRowsInFlight, kVectorsInFlight>(src, dst, lane, group_size, vectors);
  }

  if (counting) {
    __syncthreads();
    for (int s = threadIdx.x; s <= p.num_segments; s += blockDim.x) {
      if (block_counts[s] != 0) atomicAdd(p.counts + s, block_counts[s]);
    }
  }
}

template <int V, typename IdT, typename LocT>
cudaError_t launch(const SegmentedGatherArgs& p, int log2_group, cudaStream_t stream) {
  const int64_t groups_needed = (p.n + kRowsInFlight - 1) / kRowsInFlight;
  const int64_t threads_needed = groups_needed << log2_group;
  int64_t blocks = (threads_needed + kThreads - 1) / kThreads;
  const int64_t max_blocks = static_cast<int64_t>(current_multiprocessors()) * 32;
  if (blocks > max_blocks) blocks = max_blocks;
  if (blocks < 1) blocks = 1;
  gather_segmented_kernel<V, IdT, LocT><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p, log2_group);
  return cudaGetLastError();
}

template <typename IdT, typename LocT>
cudaError_t launch_vector(const SegmentedGatherArgs& p, int v, int log2_group, cudaStream_t stream) {
  switch (v) {
    case 16:
      return launch<16, IdT, LocT>(p, log2_group, stream);
    case 8:
      return launch<8, IdT, LocT>(p, log2_group, stream);
    case 4:
      return launch<4, IdT, LocT>(p, log2_group, stream);
    case 2:
      return launch<2, IdT, LocT>(p, log2_group, stream);
    default:
      return launch<1, IdT, LocT>(p, log2_group, stream);
  }
}

}  // namespace

cudaError_t launch_gather_segmented(const SegmentedGatherArgs& args, cudaStream_t stream) {
  if (args.n <= 0 || args.row_bytes <= 0) return cudaSuccess;
  if (args.num_segments < 0 || args.num_segments > kMaxSegments || args.slot_bits < 1 || args.slot_bits > 62) {
    return cudaErrorInvalidValue;
  }
  uint64_t bits = static_cast<uint64_t>(args.row_bytes) | reinterpret_cast<uintptr_t>(args.table) |
                  reinterpret_cast<uintptr_t>(args.out);
  for (int s = 0; s < args.num_segments; ++s) bits |= reinterpret_cast<uintptr_t>(args.segments[s]);
  const int v = widest_access(bits);
  const int log2_group = log2_threads_per_row(args.row_bytes / v);
  if (args.ids_int64) {
    return args.location_int64 ? launch_vector<int64_t, int64_t>(args, v, log2_group, stream)
                               : launch_vector<int64_t, int32_t>(args, v, log2_group, stream);
  }
  return args.location_int64 ? launch_vector<int32_t, int64_t>(args, v, log2_group, stream)
                             : launch_vector<int32_t, int32_t>(args, v, log2_group, stream);
}

}  // namespace zerocopy::cuda
