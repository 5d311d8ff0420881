// The pick policy of `zerocopy::sample_neighbors`: how many neighbors a target gets, which ones and in which
// order. The CPU kernel and the CUDA kernel both call `pick_positions`, so for equal inputs they draw bitwise the
// same sample: there is one copy of the policy, not two kept in step.
//
// No torch headers and no allocation: callers pass the output and, for many picks, scratch memory.
//
// Policy, per target of in-degree `degree` (its neighborhood is the edge positions [begin, begin + degree)):
//   * fanout -1, or at least as many picks as neighbors without replacement: every neighbor, in CSC order;
//   * with replacement: `fanout` independent uniform draws (none for an isolated target);
//   * without replacement, up to kFloydMaxPicks picks, or a neighborhood more than kDenseRatio times the picks:
//     Floyd's algorithm (a uniform subset; membership by a scan over the picks, or by a hash set above
//     kFloydMaxPicks), then a Fisher-Yates shuffle of the picks, because Floyd's output order is not uniform
//     (an offset above degree - count can only come late);
//   * otherwise a partial Fisher-Yates shuffle of the neighborhood (uniform subset, uniform order), with the
//     swapped entries in a hash map instead of an O(degree) array.
// So every ordered sequence of distinct picks is equally likely: order-dependent aggregators see no bias.
// Each target draws from its own counter-based stream keyed by (batch seed, hop, position in the frontier), or, in
// node-keyed sampling, by (seed, hop, node id): `target_key` picks the key.
#pragma once

#include <cstdint>

#include "ops/random.h"

namespace zerocopy::pick {

inline constexpr int64_t kFloydMaxPicks = 64;
inline constexpr int64_t kDenseRatio = 4;

// How many neighbors a target of in-degree `degree` gets: all for fanout -1, exactly `fanout` with replacement
// (none for an isolated target), at most `fanout` distinct ones without.
ZEROCOPY_HOST_DEVICE int64_t num_picks(int64_t degree, int64_t fanout, bool replace) {
  if (fanout < 0) return degree;
  if (replace) return degree > 0 ? fanout : 0;
  return degree < fanout ? degree : fanout;
}

// Slots of the hash set/map for `count` picks: a power of two at least twice the picks.
ZEROCOPY_HOST_DEVICE int64_t table_capacity(int64_t count) {
  int64_t capacity = 1;
  while (capacity < 2 * count) capacity <<= 1;
  return capacity;
}

// int64 scratch slots `pick_positions` needs for `count` picks: none up to kFloydMaxPicks or with replacement,
// else a hash table of keys and values. At most kScratchPerPick * count.
ZEROCOPY_HOST_DEVICE int64_t scratch_slots(int64_t count, bool replace) {
  return (replace || count <= kFloydMaxPicks) ? 0 : 2 * table_capacity(count);
}
inline constexpr int64_t kScratchPerPick = 8;

namespace detail {

// Open addressing with linear probing over caller memory: `capacity` keys (-1 = empty), then `capacity` values.
class OffsetTable {
 public:
  ZEROCOPY_HOST_DEVICE OffsetTable(int64_t* scratch, int64_t count)
      : keys_(scratch), values_(scratch + table_capacity(count)), mask_(table_capacity(count) - 1) {
    for (int64_t s = 0; s <= mask_; ++s) keys_[s] = -1;
  }

  // Inserts `key` (>= 0); returns false if it was already there.
  ZEROCOPY_HOST_DEVICE bool insert(int64_t key) {
    const int64_t s = slot(key);
    if (keys_[s] == key) return false;
    keys_[s] = key;
    return true;
  }

  // The value stored for `key`, else `fallback`.
  ZEROCOPY_HOST_DEVICE int64_t get(int64_t key, int64_t fallback) const {
    const int64_t s = slot(key);
    return keys_[s] == key ? values_[s] : fallback;
  }

  ZEROCOPY_HOST_DEVICE void set(int64_t key, int64_t value) {
    const int64_t s = slot(key);
    keys_[s] = key;
    values_[s] = value;
  }

 private:
  // The slot holding `key`, or the empty slot where it goes.
  ZEROCOPY_HOST_DEVICE int64_t slot(int64_t key) const {
    int64_t s = static_cast<int64_t>(rng::mix64(static_cast<uint64_t>(key)) & static_cast<uint64_t>(mask_));
    while (keys_[s] != key && keys_[s] >= 0) s = (s + 1) & mask_;
    return s;
  }

  int64_t* keys_;
  int64_t* values_;
  int64_t mask_;
};

// Floyd's algorithm: `count` distinct offsets in [0, degree), each subset equally likely (order not uniform).
ZEROCOPY_HOST_DEVICE void floyd(rng::Stream& stream, int64_t degree, int64_t count, int64_t* out, int64_t* scratch) {
  if (count <= kFloydMaxPicks) {
    int64_t picked = 0;
    for (int64_t upper = degree - count; upper < degree; ++upper) {
      const auto candidate = static_cast<int64_t>(stream.below(static_cast<uint64_t>(upper + 1)));
      bool taken = false;
      for (int64_t q = 0; q < picked; ++q) taken |= out[q] == candidate;
      out[picked++] = taken ? upper : candidate;
    }
    return;
  }
  OffsetTable taken(scratch, count);
  int64_t picked = 0;
  for (int64_t upper = degree - count; upper < degree; ++upper) {
    const auto candidate = static_cast<int64_t>(stream.below(static_cast<uint64_t>(upper + 1)));
    // `upper` is new to the set: every earlier candidate was at most upper - 1.
    if (taken.insert(candidate)) {
      out[picked++] = candidate;
    } else {
      taken.insert(upper);
      out[picked++] = upper;
    }
  }
}

// Fisher-Yates shuffle of out[0, count): every order equally likely.
ZEROCOPY_HOST_DEVICE void shuffle(rng::Stream& stream, int64_t count, int64_t* out) {
  for (int64_t i = count - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(stream.below(static_cast<uint64_t>(i + 1)));
    const int64_t held = out[i];
    out[i] = out[j];
    out[j] = held;
  }
}

// The first `count` entries of a uniform shuffle of [0, degree) (partial Fisher-Yates over a virtual identity
// array whose swapped entries live in a hash map).
ZEROCOPY_HOST_DEVICE void partial_fisher_yates(rng::Stream& stream, int64_t degree, int64_t count, int64_t* out,
                                               int64_t* scratch) {
  OffsetTable swapped(scratch, count);
  for (int64_t j = 0; j < count; ++j) {
    const int64_t r = j + static_cast<int64_t>(stream.below(static_cast<uint64_t>(degree - j)));
    out[j] = swapped.get(r, r);           // after swap(s[j], s[r]), s[j] is the old s[r] and is never read again
    swapped.set(r, swapped.get(j, j));   // s[r] = old s[j]
  }
}

}  // namespace detail

// The stream key of target `node` at frontier position `position` of hop `hop`: by position (a batch's own
// sample), or by node id when `node_keyed` (the same picks for that node at that hop in every batch).
ZEROCOPY_HOST_DEVICE uint64_t target_key(uint64_t seed, int64_t hop, int64_t position, int64_t node,
                                         bool node_keyed) {
  return node_keyed ? rng::node_stream_key(seed, static_cast<uint64_t>(hop), static_cast<uint64_t>(node))
                    : rng::stream_key(seed, static_cast<uint64_t>(hop), static_cast<uint64_t>(position));
}

// Writes the `count` = num_picks(degree, fanout, replace) picked edge positions of the neighborhood
// [begin, begin + degree) of a target to out[0, count), drawn from the stream `key` (target_key).
// `scratch` holds scratch_slots(count, replace) int64 (may be null when that is 0).
ZEROCOPY_HOST_DEVICE void pick_positions(uint64_t key, int64_t begin, int64_t degree, int64_t fanout, bool replace,
                                         int64_t count, int64_t* out, int64_t* scratch) {
  if (count == 0) return;
  if (fanout < 0 || (!replace && count == degree)) {
    for (int64_t i = 0; i < count; ++i) out[i] = begin + i;
    return;
  }
  rng::Stream stream(key);
  if (replace) {
    for (int64_t i = 0; i < count; ++i) out[i] = begin + static_cast<int64_t>(stream.below(degree));
    return;
  }
  if (count <= kFloydMaxPicks || degree > kDenseRatio * count) {
    detail::floyd(stream, degree, count, out, scratch);
    detail::shuffle(stream, count, out);
  } else {
    detail::partial_fisher_yates(stream, degree, count, out, scratch);
  }
  for (int64_t i = 0; i < count; ++i) out[i] += begin;
}

}  // namespace zerocopy::pick
