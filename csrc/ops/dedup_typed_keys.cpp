#include "ops/dedup_typed_keys.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include "ops/checks.h"

namespace zerocopy {

void check_dedup_typed_keys_args(const at::Tensor& existing_keys, const at::Tensor& candidate_keys,
                                 int64_t num_types) {
  const char* op = kDedupTypedKeys;
  check_dtype(existing_keys, at::kLong, op, "existing_keys");
  check_dtype(candidate_keys, at::kLong, op, "candidate_keys");
  check_dim(existing_keys, 1, op, "existing_keys");
  check_dim(candidate_keys, 1, op, "candidate_keys");
  check_contiguous(existing_keys, op, "existing_keys");
  check_contiguous(candidate_keys, op, "candidate_keys");
  TORCH_CHECK_VALUE(existing_keys.device() == candidate_keys.device(), op, ": `existing_keys` must be on the device "
                    "of `candidate_keys` (", candidate_keys.device(), "), got ", existing_keys.device());
  TORCH_CHECK_VALUE(num_types >= 1, op, ": `num_types` must be >= 1 (keys are id * num_types + type), got ",
                    num_types);
}

void raise_negative_key(int64_t position, int64_t num_existing, int64_t key) {
  const bool existing = position < num_existing;
  C10_THROW_ERROR(IndexError, c10::str(kDedupTypedKeys, ": `", existing ? "existing_keys" : "candidate_keys", "[",
                                       existing ? position : position - num_existing, "]` = ", key,
                                       " is negative; keys are id * num_types + type with ids >= 0"));
}

void raise_repeated_existing_key(int64_t position, int64_t key) {
  C10_THROW_ERROR(ValueError, c10::str(kDedupTypedKeys, ": `existing_keys[", position, "]` = ", key,
                                       " repeats an earlier key; the existing keys must be unique"));
}

}  // namespace zerocopy
