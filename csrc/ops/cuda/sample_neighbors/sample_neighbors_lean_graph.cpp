// The lean sampler through CUDA graphs: the launches of a batch shape (seed count, fanouts, replace, graph) are
// captured once and replayed for every later batch of that shape. A batch then costs one launch that writes its
// inputs (seed ids and random seed) into the graph's input buffer, one graph launch, the read-back, and copies of
// the outputs out of the graph's buffers, instead of about 28 kernel launches. The sample is bitwise the one the
// direct launches give: the same kernels, reading the same inputs.
//
// A graph keeps its buffers (PyTorch's private graph pool) while it is cached, so only shapes up to
// kGraphMaxSlots padded pick slots are captured and at most kMaxGraphs graphs are kept (least recently used
// dropped). A shape is captured the second time it is seen (its first batch launches directly), so a workload
// whose seed count changes every batch does not pay a capture per batch. A shape whose capture fails is
// remembered and launched directly from then on. Captures run one at a time, on a stream per device that only
// they use.
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "ops/cuda/device_access.h"
#include "ops/cuda/sample_neighbors/sample_neighbors_lean.h"
#include "ops/sample_neighbors.h"

namespace zerocopy {
namespace {

// About 150 bytes of buffers per padded slot: 2^22 slots keep up to ~600 MB per graph (batch 1024 with
// [15, 10, 5] has 0.94M slots).
constexpr int64_t kGraphMaxSlots = int64_t{1} << 22;
constexpr size_t kMaxGraphs = 4;
constexpr size_t kMaxSeenOnce = 16;  // shapes seen once, not captured yet

// On unless the environment says LZC_SAMPLER_GRAPHS=0 (an escape hatch that needs no code change).
bool graphs_by_default() {
  const char* value = std::getenv("LZC_SAMPLER_GRAPHS");
  return value == nullptr || std::string(value) != "0";
}

std::atomic<bool> graphs_enabled{graphs_by_default()};

// What a captured graph bakes in: the device, the topology's pointers and sizes, and the batch shape.
struct GraphKey {
  int device = -1;
  const void* indptr = nullptr;
  const void* indices = nullptr;
  bool indices_int64 = false;
  int64_t num_nodes = 0;
  int64_t num_edges = 0;
  int64_t num_seeds = 0;
  std::vector<int64_t> fanouts;
  bool replace = false;
  bool node_keyed = false;

  auto tie() const {
    return std::tie(device, indptr, indices, indices_int64, num_nodes, num_edges, num_seeds, fanouts, replace,
                    node_keyed);
  }
  bool operator==(const GraphKey& other) const { return tie() == other.tie(); }
};

// One captured shape. Members are destroyed in reverse order: the buffers go before the graph that owns their
// pool.
struct LeanGraph {
  GraphKey key;
  at::cuda::CUDAGraph graph;
  at::Tensor inputs;  // [1 + num_seeds]: written before each replay
  LeanBatch batch;    // the buffers the captured launches write
  std::mutex replay_mutex;
  // Recorded after the last batch's outputs were copied out (on that batch's stream): the next replay, maybe
  // on another stream, waits for it before overwriting the buffers.
  cudaEvent_t outputs_read = nullptr;

  LeanGraph() = default;
  LeanGraph(const LeanGraph&) = delete;
  LeanGraph& operator=(const LeanGraph&) = delete;
  ~LeanGraph() {
    if (outputs_read != nullptr) (void)cudaEventDestroy(outputs_read);
  }
};

class GraphCache {
 public:
  enum class Use { kReplay, kCapture, kLaunch };

  // What to do with a batch of shape `key`: replay `*graph` (set), capture it (seen before, not cached), or
  // launch directly (first sighting, or its capture failed before).
  Use decide(const GraphKey& key, std::shared_ptr<LeanGraph>* graph) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = graphs_.begin(); it != graphs_.end(); ++it) {
      if ((*it)->key == key) {
        graphs_.splice(graphs_.begin(), graphs_, it);  // most recently used first
        *graph = graphs_.front();
        return Use::kReplay;
      }
    }
    if (std::find(failed_.begin(), failed_.end(), key) != failed_.end()) return Use::kLaunch;
    auto seen = std::find(seen_once_.begin(), seen_once_.end(), key);
    if (seen != seen_once_.end()) {
      seen_once_.erase(seen);
      return Use::kCapture;
    }
    seen_once_.push_back(key);
    if (seen_once_.size() > kMaxSeenOnce) seen_once_.erase(seen_once_.begin());
    return Use::kLaunch;
  }

  void add(std::shared_ptr<LeanGraph> graph) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.captures;
    graphs_.push_front(std::move(graph));
    while (graphs_.size() > kMaxGraphs) {
      graphs_.pop_back();  // a replay still running keeps its graph alive through its shared_ptr
      ++stats_.evictions;
    }
  }

  void mark_failed(const GraphKey& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.failures;
    failed_.push_back(key);
  }

  void count_replay() {
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.replays;
  }

  SamplerGraphStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    SamplerGraphStats s = stats_;
    s.cached = static_cast<int64_t>(graphs_.size());
    return s;
  }

 private:
  std::mutex mutex_;
  std::list<std::shared_ptr<LeanGraph>> graphs_;
  std::vector<GraphKey> failed_;
  std::vector<GraphKey> seen_once_;
  SamplerGraphStats stats_;
};

// Never destroyed: graphs and their pools must not be torn down after the CUDA runtime at process exit.
GraphCache& cache() {
  static auto* instance = new GraphCache();
  return *instance;
}

// Captures run one at a time, each on a stream of the device that nothing else uses: a stream from PyTorch's pool
// may be handed to other code too (`torch.cuda.Stream()`), whose work would then be captured into the graph.
std::mutex& capture_mutex() {
  static auto* mutex = new std::mutex();
  return *mutex;
}

// The device's capture stream (made on first use, never destroyed); call with capture_mutex() held.
c10::cuda::CUDAStream capture_stream(c10::DeviceIndex device) {
  static auto* streams = new std::map<c10::DeviceIndex, cudaStream_t>();
  auto it = streams->find(device);
  if (it == streams->end()) {
    cudaStream_t stream = nullptr;
    cuda::check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), kSampleNeighbors,
                     "creating the graph capture stream");
    it = streams->emplace(device, stream).first;
  }
  return c10::cuda::getStreamFromExternal(it->second, device);
}

GraphKey key_of(const cuda::Topology& graph, const LeanShape& shape, int device) {
  return GraphKey{device,          graph.indptr,    graph.indices, graph.indices_int64, graph.num_nodes,
                  graph.num_edges, shape.num_seeds, shape.fanouts, shape.replace,        shape.node_keyed};
}

// Captures the shape's launches on the device's capture stream (capture cannot run on the legacy default stream)
// into a new graph, whose buffers come from its private pool. Null if the capture failed.
std::shared_ptr<LeanGraph> capture(const cuda::Topology& graph, const LeanShape& shape, const at::Tensor& seeds,
                                   GraphKey key) {
  auto lean = std::make_shared<LeanGraph>();
  lean->key = std::move(key);
  if (cudaEventCreateWithFlags(&lean->outputs_read, cudaEventDisableTiming) != cudaSuccess) {
    lean->outputs_read = nullptr;
    (void)cudaGetLastError();
    return nullptr;
  }
  lean->inputs = lean_inputs_buffer(seeds);
  const std::lock_guard<std::mutex> one_capture_at_a_time(capture_mutex());
  std::optional<c10::cuda::CUDAStream> side;
  try {
    side = capture_stream(seeds.device().index());
  } catch (const c10::Error&) {
    (void)cudaGetLastError();
    return nullptr;
  }
  const c10::cuda::CUDAStreamGuard on_side(*side);
  try {
    // Thread-local: other threads of the process (a training loop, a gather thread) keep using CUDA freely.
    lean->graph.capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
  } catch (const c10::Error&) {
    return nullptr;
  }
  try {
    lean->batch = enqueue_lean(graph, shape, lean->inputs, side->stream());
  } catch (const c10::Error&) {
    try {
      lean->graph.capture_end();
    } catch (const c10::Error&) {
    }
    (void)cudaGetLastError();
    return nullptr;
  }
  try {
    lean->graph.capture_end();
  } catch (const c10::Error&) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return lean;
}

}  // namespace

bool sampler_graphs_enabled() { return graphs_enabled.load(std::memory_order_relaxed); }

bool set_sampler_graphs_enabled(bool enabled) { return graphs_enabled.exchange(enabled); }

SamplerGraphStats sampler_graph_stats() { return cache().stats(); }

std::optional<CudaSample> sample_lean_with_graph(const cuda::Topology& graph, const LeanShape& shape,
                                                 const at::Tensor& seeds, int64_t rng_seed, cudaStream_t stream) {
  if (!sampler_graphs_enabled() || shape.slots > kGraphMaxSlots) return std::nullopt;
  GraphKey key = key_of(graph, shape, seeds.device().index());
  std::shared_ptr<LeanGraph> lean;
  const GraphCache::Use use = cache().decide(key, &lean);
  if (use == GraphCache::Use::kLaunch) return std::nullopt;
  if (use == GraphCache::Use::kCapture) {
    lean = capture(graph, shape, seeds, key);
    if (lean == nullptr) {
      cache().mark_failed(key);
      return std::nullopt;
    }
    cache().add(lean);
  }
  // One batch at a time per graph: its input and output buffers are shared by every replay.
  std::lock_guard<std::mutex> lock(lean->replay_mutex);
  cuda::check_cuda(cudaStreamWaitEvent(stream, lean->outputs_read, 0), kSampleNeighbors,
                   "waiting for the previous batch's copies");
  fill_lean_inputs(seeds, rng_seed, lean->inputs, stream);
  lean->graph.replay();  // on the current stream, which is `stream` (the caller's device guard)
  cache().count_replay();
  CudaSample sample =
      finish_lean(lean->batch, graph, static_cast<int64_t>(shape.fanouts.size()), stream, /*copy_out=*/true);
  cuda::check_cuda(cudaEventRecord(lean->outputs_read, stream), kSampleNeighbors, "recording the copies");
  return sample;
}

}  // namespace zerocopy
