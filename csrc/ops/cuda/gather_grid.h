// How many blocks a gather kernel launches at most: the device's multiprocessors times a process-wide number of
// blocks per multiprocessor (32 by default), beyond which the kernels' grid-stride loops cover the rest of the rows.
// Fewer, longer-lived blocks hold the multiprocessors for longer: a kernel of another stream of the same process (the
// pipeline worker samples the next batch while it gathers this one) waits for the gather's blocks to retire.
#pragma once

#include <cstdint>

namespace zerocopy::cuda {

constexpr int64_t kDefaultGatherBlocksPerMultiprocessor = 32;

int64_t gather_blocks_per_multiprocessor();

// Sets it (>= 1) for the whole process; returns the previous value.
int64_t set_gather_blocks_per_multiprocessor(int64_t blocks);

}  // namespace zerocopy::cuda
