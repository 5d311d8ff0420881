// CPU kernel of `zerocopy::dedup_typed_keys`: one thread, one open-addressing hash table.
//
// The existing keys are inserted with their own positions as local indices (a repeat is an error); then each
// candidate in order either finds its key (its local index) or inserts it as the next new key (local index
// num_existing + number of new keys so far) and counts it for its type. That is the definition of first appearance,
// so the result is bitwise the sort-based torch reference (lightning_zerocopy.sampling.typed_dedup.first_appearance).
// The table (a power of two >= 2x the keys, entries of key and local index side by side, one cache line per probe)
// is the calling thread's, kept between calls: 16 bytes x 2 x the keys of the thread's largest call stay allocated.
// The probe of a later candidate is prefetched while the current one is looked up.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <cstdint>
#include <vector>

#include "ops/checks.h"
#include "ops/dedup_typed_keys.h"
#include "ops/random.h"

namespace zerocopy {
namespace {

constexpr int64_t kEmpty = -1;  // keys are >= 0
constexpr int64_t kPrefetchAhead = 16;

struct Entry {
  int64_t key;
  int64_t local;
};

// The calling thread's table, grown to its largest call and kept between calls (a call clears the entries it used,
// not the whole table: an allocation and a fill of 16 bytes x 2 x the keys cost as much as the lookups).
class KeyTable {
 public:
  // The table of the calling thread, empty, for up to `keys` keys: a power of two >= 2x entries of its buffer.
  static KeyTable& of_this_thread(int64_t keys) {
    thread_local KeyTable table;
    table.size_for(keys);
    return table;
  }

  void prefetch(int64_t key) const { __builtin_prefetch(&entries_[home(key)]); }

  // The entry holding `key`, or the empty entry where it goes (fill it with `take`).
  Entry& find(int64_t key) {
    uint64_t s = home(key);
    while (entries_[s].key != key && entries_[s].key != kEmpty) s = (s + 1) & mask_;
    last_ = s;
    return entries_[s];
  }

  // Fills the entry `find` returned last.
  void take(int64_t key, int64_t local) {
    entries_[last_] = Entry{key, local};
    used_.push_back(last_);
  }

  // Empties the entries taken since the table was sized.
  void clear() {
    for (const uint64_t s : used_) entries_[s].key = kEmpty;
    used_.clear();
  }

 private:
  void size_for(int64_t keys) {
    uint64_t capacity = 16;
    while (capacity < 2 * static_cast<uint64_t>(keys)) capacity *= 2;
    if (entries_.size() < capacity) entries_.assign(capacity, Entry{kEmpty, 0});
    mask_ = capacity - 1;  // a prefix of the buffer: a small call stays in cache
    used_.reserve(static_cast<size_t>(keys));
  }

  uint64_t home(int64_t key) const { return rng::mix64(static_cast<uint64_t>(key)) & mask_; }

  std::vector<Entry> entries_;
  std::vector<uint64_t> used_;
  uint64_t mask_ = 0;
  uint64_t last_ = 0;
};

// Clears the thread's table when the call ends, returned or raised.
struct ClearOnExit {
  KeyTable& table;
  ~ClearOnExit() { table.clear(); }
};

DedupedKeys dedup_typed_keys_cpu(const at::Tensor& existing_keys, const at::Tensor& candidate_keys,
                                 int64_t num_types) {
  check_dedup_typed_keys_args(existing_keys, candidate_keys, num_types);
  check_cpu(candidate_keys, kDedupTypedKeys, "candidate_keys");
  at::Tensor counts = at::zeros({num_types}, at::kLong);
  const int64_t num_candidates = candidate_keys.numel();
  if (num_candidates == 0) return {candidate_keys.new_empty({0}), candidate_keys.new_empty({0}), counts};
  const int64_t num_existing = existing_keys.numel();
  const int64_t* existing = existing_keys.const_data_ptr<int64_t>();
  const int64_t* candidates = candidate_keys.const_data_ptr<int64_t>();
  // the first negative key of cat([existing, candidates]), as the CUDA kernel reports it
  for (int64_t p = 0; p < num_existing; ++p) {
    if (existing[p] < 0) raise_negative_key(p, num_existing, existing[p]);
  }
  for (int64_t q = 0; q < num_candidates; ++q) {
    if (candidates[q] < 0) raise_negative_key(num_existing + q, num_existing, candidates[q]);
  }
  KeyTable& table = KeyTable::of_this_thread(num_existing + num_candidates);
  const ClearOnExit clear_on_exit{table};
  for (int64_t p = 0; p < num_existing; ++p) {
    if (p + kPrefetchAhead < num_existing) table.prefetch(existing[p + kPrefetchAhead]);
    if (table.find(existing[p]).key != kEmpty) raise_repeated_existing_key(p, existing[p]);
    table.take(existing[p], p);
  }
  at::Tensor new_keys = at::empty({num_candidates}, at::kLong);
  at::Tensor local = at::empty({num_candidates}, at::kLong);
  int64_t* new_p = new_keys.data_ptr<int64_t>();
  int64_t* local_p = local.data_ptr<int64_t>();
  int64_t* counts_p = counts.data_ptr<int64_t>();
  int64_t fresh = 0;
  for (int64_t q = 0; q < num_candidates; ++q) {
    if (q + kPrefetchAhead < num_candidates) table.prefetch(candidates[q + kPrefetchAhead]);
    const int64_t key = candidates[q];
    const Entry& entry = table.find(key);
    if (entry.key == kEmpty) {
      table.take(key, num_existing + fresh);
      new_p[fresh++] = key;
      ++counts_p[key % num_types];
    }
    local_p[q] = entry.local;
  }
  return {new_keys.narrow(0, 0, fresh), local, counts};
}

}  // namespace

TORCH_LIBRARY_IMPL(zerocopy, CPU, m) { m.impl("dedup_typed_keys", &dedup_typed_keys_cpu); }

}  // namespace zerocopy
