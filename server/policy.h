// Budget policies: defaults, validation, and the policy file (text format or JSON of
// retrybudget.v1.PolicyConfig).
#ifndef RETRYBUDGET_SERVER_POLICY_H_
#define RETRYBUDGET_SERVER_POLICY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "retrybudget/v1/budget.pb.h"
#include "server/ref_ptr.h"
#include "server/window_ledger.h"

namespace retrybudget {

// A policy with every default applied and every field checked. Two shapes: the token bucket
// (capacity, refill_per_second, success_credit, initial_tokens) and the windowed ratio
// (retry_ratio, min_retries_per_second, ttl: budget.proto, DESIGN.md). A windowed policy has
// capacity = initial_tokens = min_retries_per_second * ttl (the floor of one window),
// refill_per_second = min_retries_per_second and success_credit = 0; its ToProto() names only
// its own shape's fields.
struct ResolvedPolicy {
  double capacity = 100;
  double refill_per_second = 1;
  double success_credit = 0.1;
  double initial_tokens = 100;
  absl::Duration lease_ttl = absl::Seconds(5);
  // MODE_SHADOW: a dry run (clients allow every retry and count the would-be denials).
  bool shadow = false;
  // The windowed ratio shape; the three fields below are 0 for the token bucket.
  bool windowed = false;
  double retry_ratio = 0;
  double min_retries_per_second = 0;
  absl::Duration ttl = absl::ZeroDuration();

  // The same policy as a message with every field of its shape set explicitly.
  v1::BudgetPolicy ToProto() const;

  friend bool operator==(const ResolvedPolicy&, const ResolvedPolicy&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const ResolvedPolicy& p) {
    return H::combine(std::move(h), p.capacity, p.refill_per_second, p.success_credit,
                      p.initial_tokens, p.lease_ttl, p.shadow, p.windowed, p.retry_ratio,
                      p.min_retries_per_second, p.ttl);
  }
};

// A policy interned by PolicyTable: immutable, shared by the budgets that hold it (RefPtr, 8
// bytes per budget).
struct InternedPolicy final : RefCounted, ResolvedPolicy {
  explicit InternedPolicy(const ResolvedPolicy& p)
      : ResolvedPolicy(p),
        lease_ttl_ns(absl::ToInt64Nanoseconds(p.lease_ttl)),
        ttl_ns(absl::ToInt64Nanoseconds(p.ttl)),
        window_shape(WindowLedger::ShapeOf(ttl_ns, lease_ttl_ns, p.capacity)) {}

  // lease_ttl in nanoseconds (a whole number of milliseconds: ResolvePolicy checks it), for the
  // arithmetic of every Sync entry: absl's conversions and divisions of a Duration are calls
  // into the library, with 128-bit arithmetic.
  const int64_t lease_ttl_ns;
  // ttl in nanoseconds (0 for the token bucket), for the window's arithmetic.
  const int64_t ttl_ns;
  // A windowed policy's slots (meaningless for the token bucket): computed once, not per Sync.
  const WindowShape window_shape;
};
using PolicyRef = RefPtr<const InternedPolicy>;

// One shared, immutable copy of each distinct policy in use. A budget holds its policy as a
// pointer to it: a million budgets under a few policies do not each carry a 48-byte copy.
// Copies no budget holds any more (the table's own reference is the last) are dropped as the
// table grows (amortised), so a stream of distinct admin policies does not accumulate.
// Thread-compatible: the caller serialises calls.
class PolicyTable {
 public:
  PolicyRef Intern(const ResolvedPolicy& policy);
  size_t size() const { return by_value_.size(); }

 private:
  absl::flat_hash_map<ResolvedPolicy, PolicyRef> by_value_;
  size_t prune_at_ = 64;
};

// Applies the defaults of budget.proto to unset (zero) fields and checks ranges. `field` prefixes
// error messages (e.g. "tenants[2].policy"). INVALID_ARGUMENT names the field and the value.
absl::StatusOr<ResolvedPolicy> ResolvePolicy(const v1::BudgetPolicy& policy,
                                             absl::string_view field = "policy");

// Parses a policy file's contents. The format is detected: JSON when the first non-blank
// character is '{', protobuf text format otherwise. Validates every policy and that tenant names
// are well-formed and unique. Errors name the line (text format) and the field.
absl::StatusOr<v1::PolicyConfig> ParsePolicyConfig(absl::string_view contents);

// Checks the credentials of a config: unique names, well-formed SHA-256 hashes, valid tenant
// names, each credential granting something. Part of ParsePolicyConfig.
absl::Status ValidateCredentials(const v1::PolicyConfig& config);

// Reads and parses `path`. Errors name the path.
absl::StatusOr<v1::PolicyConfig> LoadPolicyFile(const std::string& path);

}  // namespace retrybudget

#endif  // RETRYBUDGET_SERVER_POLICY_H_
