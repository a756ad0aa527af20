// Budget policies: defaults, validation, and the policy file (text format or JSON of
// retrybudget.v1.PolicyConfig).
#ifndef RETRYBUDGET_SERVER_POLICY_H_
#define RETRYBUDGET_SERVER_POLICY_H_

#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "retrybudget/v1/budget.pb.h"

namespace retrybudget {

// A policy with every default applied and every field checked.
struct ResolvedPolicy {
  double capacity = 100;
  double refill_per_second = 1;
  double success_credit = 0.1;
  double initial_tokens = 100;
  absl::Duration lease_ttl = absl::Seconds(5);

  // The same policy as a message with every field set explicitly.
  v1::BudgetPolicy ToProto() const;
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
