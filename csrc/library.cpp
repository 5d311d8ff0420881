// Every op schema of the `zerocopy` torch library, in one place.
//
// Kernels register per dispatch key in csrc/ops/cpu/*_kernel.cpp (CPU) and csrc/ops/cuda/*_cuda.cpp (CUDA);
// Python wrappers with fake (meta) implementations live in lightning_zerocopy/ops.py.
#include <torch/library.h>

TORCH_LIBRARY(zerocopy, m) {
  // Compress a COO edge list by destination (CSC over edge_index[1]): for target v, its incoming
  // neighbors are indices[indptr[v]:indptr[v+1]], sorted by source id within each target.
  // edge_perm[k] is the position in the input edge list of the k-th compressed edge.
  // indices is int32 when num_nodes fits, else int64.
  m.def(
      "build_csc(Tensor src, Tensor dst, int num_nodes, bool remove_self_loops, bool remove_duplicates)"
      " -> (Tensor indptr, Tensor indices, Tensor edge_perm)");

  // Multi-hop uniform neighbor sampling over incoming edges (CSC). Seeds come first in n_id, then each
  // hop's new nodes in order of first appearance. row = local id of the sampled neighbor (message source),
  // col = local id of the target. edge_pos = position of each sampled edge in `indices`.
  // num_sampled_nodes has len(fanouts)+1 entries (seeds first), num_sampled_edges len(fanouts); both int64 CPU.
  // node_keyed (evaluation): each target's picks are keyed by (seed, hop, node id) instead of its position, and
  // nodes are deduplicated per hop only (hop k's neighbors form level k + 1 of n_id, where a node of a lower
  // level may appear again), so a seed's sampled computation graph does not depend on its batch-mates.
  m.def(
      "sample_neighbors(Tensor indptr, Tensor indices, Tensor seeds, int[] fanouts, bool replace, int seed,"
      " bool node_keyed=False)"
      " -> (Tensor n_id, Tensor row, Tensor col, Tensor edge_pos, Tensor num_sampled_nodes,"
      " Tensor num_sampled_edges)");

  // One hop of sample_neighbors without its deduplication and relabeling: the picks of every target, drawn exactly as
  // sample_neighbors(indptr, indices, targets, [fanout], replace, seed, node_keyed) draws them (same keys, same
  // order: by target, then pick). nbr = global id of each picked neighbor, col = position of its target in
  // `targets`, edge_pos = position in `indices`; targets need not be unique. edge_ends[s] (int64, CPU) = number of
  // edges of targets[0 : target_ends[s]] (the picks are ordered by target, so a range of targets owns a range of
  // edges): the one read-back a caller that splits the picks by target range needs.
  m.def(
      "pick_neighbors(Tensor indptr, Tensor indices, Tensor targets, int fanout, bool replace, int seed,"
      " bool node_keyed, int[] target_ends) -> (Tensor nbr, Tensor col, Tensor edge_pos, Tensor edge_ends)");

  // A typed sample's per-hop deduplication over keys id * num_types + type (all >= 0): new_keys = the candidate
  // keys not in existing_keys (unique), in order of first appearance; local[q] = the index of candidate_keys[q] in
  // cat([existing_keys, new_keys]); type_counts[t] (int64, CPU) = the new keys with key % num_types == t. A hash
  // table on both devices; the CUDA kernel synchronizes once (the counts). The Python wrapper and its fake live in
  // lightning_zerocopy/sampling/typed_dedup.py.
  m.def(
      "dedup_typed_keys(Tensor existing_keys, Tensor candidate_keys, int num_types)"
      " -> (Tensor new_keys, Tensor local, Tensor type_counts)");

  // out[i] = table[ids[i]] for a 2-D row-major table. The CUDA kernel reads the table directly from
  // registered (pinned, mapped) host memory or from device memory, with two locality levers: sort_ids reads
  // the rows in ascending id (address) order and writes each back to its batch position (the CPU kernel
  // ignores it: same result); cache_slot (int32, one entry per table row, -1 = not cached) and cache (rows of
  // the same width and dtype, on the GPU) serve hot rows from GPU memory (CUDA only).
  m.def(
      "gather_rows_into(Tensor table, Tensor ids, Tensor(a!) out, bool sort_ids=False,"
      " Tensor? cache_slot=None, Tensor? cache=None) -> ()");

  // out[i] = table[ids[i]] with cached rows read from `segments` (shards of a GPU feature cache: this GPU's
  // memory, or a peer GPU's opened over CUDA IPC) through a per-row lookup: location[row] < 0 = read from `table`
  // (registered host memory or device memory), else slot (location & (2^slot_bits - 1)) of segment
  // (location >> slot_bits). `counts` (len(segments) + 1, int64) gets the rows served per segment, then from
  // `table`, added on the device. sort_ids (CUDA) reads the rows in ascending id (address) order and writes each
  // back to its batch position; the result is the same.
  m.def(
      "gather_segmented_into(Tensor table, Tensor ids, Tensor(a!) out, Tensor location, int slot_bits,"
      " Tensor[] segments, Tensor(b!)? counts=None, bool sort_ids=False) -> ()");

  // Node ids for negative edges: out[i] is drawn from the counter-based stream keyed by (seed, endpoint,
  // positions[i]) (csrc/ops/negative_draw.h), so it is the same on every device and in any order. Uniform over
  // [0, num_nodes) when cum_weight is None, else by inverse CDF over cum_weight (float64 inclusive prefix sums
  // of per-node weights, one per node, on the device of `positions`). endpoint: 0 = source, 1 = destination.
  m.def("negative_nodes(Tensor positions, int num_nodes, int seed, int endpoint, Tensor? cum_weight=None) -> Tensor");

  // CUDA IPC of device memory by its handle alone (no interprocess event, no reference-counter file: nothing under
  // /dev/shm that a killed process could leave behind). cuda_ipc_handle: the opaque handle (uint8, CPU) of the
  // allocation holding a contiguous CUDA tensor, and the byte offset of the tensor's first element in it.
  // cuda_ipc_open (another process): nbytes from that offset as a uint8 tensor on `device`, the GPU that reads it
  // (the memory may live on a peer GPU; it is mapped for `device`, with peer access). The exporter keeps the memory
  // alive while any opener uses it. CUDA builds only.
  m.def("cuda_ipc_handle(Tensor tensor) -> (Tensor handle, int offset)");
  m.def("cuda_ipc_open(Tensor handle, int offset, int nbytes, Device device) -> Tensor");

  // The CUDA sampler's process-wide switches (benchmarks and tests compare its paths), each returning the old
  // setting: whether batches with every fanout >= 1 take the lean path (one read-back per batch), and whether lean
  // batches replay a CUDA graph captured per batch shape (LZC_SAMPLER_GRAPHS=0 turns it off at start). And the
  // graph path's counters since the process started: [captures, replays, failures, evictions, cached]. No tensor
  // arguments (kernels under CompositeExplicitAutograd); CUDA builds only.
  m.def("set_lean_sampler(bool enabled) -> bool");
  m.def("set_sampler_graphs(bool enabled) -> bool");
  m.def("sampler_graph_stats() -> int[]");
}
