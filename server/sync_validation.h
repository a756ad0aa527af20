// The checks of a SyncRequest that decide whether it may be applied at all: those that need no
// state (names, limits, bounds, internal consistency of each entry) and those against what was
// applied before for an instance and tenant. Never changes state; every refusal is
// INVALID_ARGUMENT naming the field and value.
#ifndef RETRYBUDGET_SERVER_SYNC_VALIDATION_H_
#define RETRYBUDGET_SERVER_SYNC_VALIDATION_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "retrybudget/v1/budget.pb.h"
#include "server/grant_math.h"

namespace retrybudget {

// How far past the last applied seq a known instance's next seq may jump: far beyond any
// client's pace, and small enough that no single request can exhaust the 2^53 seq space.
inline constexpr uint64_t kMaxSeqJump = uint64_t{1} << 32;

struct SyncLimits {
  size_t max_tenants_per_request = 256;
  uint64_t max_want = 1'000'000;
};

// Checks what can be checked without state.
absl::Status ValidateRequest(const v1::SyncRequest& request, const SyncLimits& limits);

// Checks entry `index` against the record of what was applied for it: no counter goes
// backwards, and no more tokens are received than this server granted since the baseline.
absl::Status CheckAgainstApplied(int index, const v1::TenantSync& sent, const LedgerEntry& applied);

}  // namespace retrybudget

#endif  // RETRYBUDGET_SERVER_SYNC_VALIDATION_H_
