#include "server/policy.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "retrybudget/names.h"

namespace retrybudget {
namespace {

constexpr double kMaxCapacity = 1e12;
constexpr double kMaxRate = 1e9;
constexpr int64_t kMinLeaseTtlMs = 100;
constexpr int64_t kMaxLeaseTtlMs = 600'000;
// The windowed ratio shape: Linkerd's defaults, Finagle's bounds on the window.
constexpr double kDefaultRetryRatio = 0.2;
constexpr double kMaxRetryRatio = 10;
constexpr double kDefaultMinRetriesPerSecond = 10;
constexpr int64_t kDefaultTtlMs = 10'000;
constexpr int64_t kMinTtlMs = 1'000;
constexpr int64_t kMaxTtlMs = 60'000;

absl::Status BadField(absl::string_view field, absl::string_view name, double value,
                      absl::string_view rule) {
  return absl::InvalidArgumentError(
      absl::StrFormat("%s.%s = %g is invalid: %s", field, name, value, rule));
}

// Collects text-format parse errors with their line and column.
class ErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (first_.empty()) first_ = absl::StrFormat("line %d, column %d: %s", line + 1, column + 1, message);
  }
  void AddWarning(int, int, const std::string&) override {}
  const std::string& first() const { return first_; }

 private:
  std::string first_;
};

}  // namespace

v1::BudgetPolicy ResolvedPolicy::ToProto() const {
  v1::BudgetPolicy p;
  if (windowed) {
    p.set_retry_ratio(retry_ratio);
    p.set_min_retries_per_second(min_retries_per_second);
    p.set_ttl_ms(absl::ToInt64Milliseconds(ttl));
  } else {
    p.set_capacity(capacity);
    p.set_refill_per_second(refill_per_second);
    p.set_success_credit(success_credit);
    p.set_initial_tokens(initial_tokens);
  }
  p.set_lease_ttl_ms(absl::ToInt64Milliseconds(lease_ttl));
  p.set_mode(shadow ? v1::MODE_SHADOW : v1::MODE_ENFORCE);
  return p;
}

namespace {

absl::Status ResolveMode(const v1::BudgetPolicy& policy, absl::string_view field,
                         ResolvedPolicy& r) {
  switch (policy.mode()) {
    case v1::MODE_UNSPECIFIED:
    case v1::MODE_ENFORCE:
      r.shadow = false;
      return absl::OkStatus();
    case v1::MODE_SHADOW:
      r.shadow = true;
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s.mode = %d is invalid: must be MODE_ENFORCE (1) or MODE_SHADOW (2)", field,
          static_cast<int>(policy.mode())));
  }
}

// The fields of each shape the policy sets, in proto order, for the message refusing both.
std::string SetFields(const v1::BudgetPolicy& policy, bool windowed) {
  std::vector<std::string> names;
  if (windowed) {
    if (policy.has_retry_ratio()) names.push_back("retry_ratio");
    if (policy.has_min_retries_per_second()) names.push_back("min_retries_per_second");
    if (policy.has_ttl_ms()) names.push_back("ttl_ms");
  } else {
    if (policy.has_capacity()) names.push_back("capacity");
    if (policy.has_refill_per_second()) names.push_back("refill_per_second");
    if (policy.has_success_credit()) names.push_back("success_credit");
    if (policy.has_initial_tokens()) names.push_back("initial_tokens");
  }
  return absl::StrJoin(names, ", ");
}

bool SetsWindowedFields(const v1::BudgetPolicy& policy) {
  return policy.has_retry_ratio() || policy.has_min_retries_per_second() || policy.has_ttl_ms();
}

bool SetsBucketFields(const v1::BudgetPolicy& policy) {
  return policy.has_capacity() || policy.has_refill_per_second() || policy.has_success_credit() ||
         policy.has_initial_tokens();
}

// The windowed ratio shape's fields, defaults and the bucket fields it implies.
absl::Status ResolveWindowed(const v1::BudgetPolicy& policy, absl::string_view field,
                             ResolvedPolicy& r) {
  r.windowed = true;
  r.retry_ratio = kDefaultRetryRatio;
  r.min_retries_per_second = kDefaultMinRetriesPerSecond;
  int64_t ttl_ms = kDefaultTtlMs;
  if (policy.has_retry_ratio()) {
    const double v = policy.retry_ratio();
    if (!std::isfinite(v) || v < 0 || v > kMaxRetryRatio) {
      return BadField(field, "retry_ratio", v, "must be in [0, 10]");
    }
    r.retry_ratio = v;
  }
  if (policy.has_min_retries_per_second()) {
    const double v = policy.min_retries_per_second();
    if (!std::isfinite(v) || v < 0 || v > kMaxRate) {
      return BadField(field, "min_retries_per_second", v, "must be in [0, 1e9]");
    }
    r.min_retries_per_second = v;
  }
  if (policy.has_ttl_ms()) {
    const int64_t v = policy.ttl_ms();
    if (v < kMinTtlMs || v > kMaxTtlMs) {
      return BadField(field, "ttl_ms", static_cast<double>(v),
                      absl::StrFormat("must be in [%d, %d]", kMinTtlMs, kMaxTtlMs));
    }
    ttl_ms = v;
  }
  r.ttl = absl::Milliseconds(ttl_ms);
  r.capacity = r.min_retries_per_second * static_cast<double>(ttl_ms) / 1000.0;
  r.initial_tokens = r.capacity;
  r.refill_per_second = r.min_retries_per_second;
  r.success_credit = 0;
  r.lease_ttl = absl::Milliseconds(std::max<int64_t>(kMinLeaseTtlMs, ttl_ms / 10));
  if (policy.has_lease_ttl_ms()) {
    const int64_t v = policy.lease_ttl_ms();
    if (v < kMinLeaseTtlMs || v > ttl_ms) {
      return BadField(field, "lease_ttl_ms", static_cast<double>(v),
                      absl::StrFormat("must be in [%d, ttl_ms = %d] for a windowed policy",
                                      kMinLeaseTtlMs, ttl_ms));
    }
    r.lease_ttl = absl::Milliseconds(v);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ResolvedPolicy> ResolvePolicy(const v1::BudgetPolicy& policy,
                                             absl::string_view field) {
  ResolvedPolicy r;
  if (absl::Status s = ResolveMode(policy, field, r); !s.ok()) return s;
  if (SetsWindowedFields(policy)) {
    if (SetsBucketFields(policy)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s sets fields of both shapes: %s (the token bucket) and %s (the windowed ratio); "
          "set one shape's fields only",
          field, SetFields(policy, false), SetFields(policy, true)));
    }
    if (absl::Status s = ResolveWindowed(policy, field, r); !s.ok()) return s;
    return r;
  }
  if (policy.has_capacity()) {
    const double v = policy.capacity();
    if (!std::isfinite(v) || v <= 0 || v > kMaxCapacity) {
      return BadField(field, "capacity", v, "must be in (0, 1e12]");
    }
    r.capacity = v;
  }
  if (policy.has_refill_per_second()) {
    const double v = policy.refill_per_second();
    if (!std::isfinite(v) || v < 0 || v > kMaxRate) {
      return BadField(field, "refill_per_second", v, "must be in [0, 1e9]");
    }
    r.refill_per_second = v;
  }
  if (policy.has_success_credit()) {
    const double v = policy.success_credit();
    if (!std::isfinite(v) || v < 0 || v > kMaxRate) {
      return BadField(field, "success_credit", v, "must be in [0, 1e9]");
    }
    r.success_credit = v;
  }
  r.initial_tokens = r.capacity;
  if (policy.has_initial_tokens()) {
    const double v = policy.initial_tokens();
    if (!std::isfinite(v) || v < 0 || v > r.capacity) {
      return BadField(field, "initial_tokens", v,
                      absl::StrFormat("must be in [0, capacity = %g]", r.capacity));
    }
    r.initial_tokens = v;
  }
  if (policy.has_lease_ttl_ms()) {
    const int64_t v = policy.lease_ttl_ms();
    if (v < kMinLeaseTtlMs || v > kMaxLeaseTtlMs) {
      return BadField(field, "lease_ttl_ms", static_cast<double>(v),
                      absl::StrFormat("must be in [%d, %d]", kMinLeaseTtlMs, kMaxLeaseTtlMs));
    }
    r.lease_ttl = absl::Milliseconds(v);
  }
  return r;
}

absl::StatusOr<v1::PolicyConfig> ParsePolicyConfig(absl::string_view contents) {
  v1::PolicyConfig config;
  const size_t first = contents.find_first_not_of(" \t\r\n");
  if (first != absl::string_view::npos && contents[first] == '{') {
    google::protobuf::util::JsonParseOptions options;
    const auto status = google::protobuf::util::JsonStringToMessage(
        google::protobuf::StringPiece(contents.data(), contents.size()), &config, options);
    if (!status.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("policy (JSON) does not parse: ", status.message().as_string()));
    }
  } else {
    google::protobuf::TextFormat::Parser parser;
    ErrorCollector errors;
    parser.RecordErrorsTo(&errors);
    if (!parser.ParseFromString(std::string(contents), &config)) {
      return absl::InvalidArgumentError(
          absl::StrCat("policy (text format) does not parse: ", errors.first()));
    }
  }
  if (auto p = ResolvePolicy(config.default_policy(), "default_policy"); !p.ok()) {
    return p.status();
  }
  absl::flat_hash_set<std::string> seen;
  for (int i = 0; i < config.tenants_size(); ++i) {
    const auto& t = config.tenants(i);
    const std::string field = absl::StrCat("tenants[", i, "]");
    if (auto s = ValidateTenantName(t.tenant(), field + ".tenant"); !s.ok()) return s;
    if (!seen.insert(t.tenant()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".tenant ", QuoteForError(t.tenant()), " is listed twice"));
    }
    if (auto p = ResolvePolicy(t.policy(), field + ".policy"); !p.ok()) return p.status();
  }
  if (auto s = ValidateCredentials(config); !s.ok()) return s;
  return config;
}

absl::Status ValidateCredentials(const v1::PolicyConfig& config) {
  absl::flat_hash_set<std::string> names;
  absl::flat_hash_set<std::string> hashes;
  for (int i = 0; i < config.credentials_size(); ++i) {
    const v1::Credential& c = config.credentials(i);
    const std::string field = absl::StrCat("credentials[", i, "]");
    if (c.name().empty()) return absl::InvalidArgumentError(field + ".name is empty");
    if (!names.insert(c.name()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".name ", QuoteForError(c.name()), " is listed twice"));
    }
    const std::string& h = c.token_sha256();
    const bool hex = h.size() == 64 && std::all_of(h.begin(), h.end(), [](char ch) {
                       return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f');
                     });
    if (!hex) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".token_sha256 ", QuoteForError(h),
          " is not 64 lowercase hex characters (the SHA-256 of the token)"));
    }
    if (!hashes.insert(h).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".token_sha256 is the same token as another credential"));
    }
    if (c.tenants_size() == 0 && !c.admin()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " (", QuoteForError(c.name()), ") grants nothing: list tenants or set admin"));
    }
    for (int j = 0; j < c.tenants_size(); ++j) {
      if (auto s = ValidateTenantName(c.tenants(j), absl::StrCat(field, ".tenants[", j, "]"));
          !s.ok()) {
        return s;
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::PolicyConfig> LoadPolicyFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("policy file ", path, " cannot be read"));
  }
  std::stringstream buf;
  buf << in.rdbuf();
  auto config = ParsePolicyConfig(buf.str());
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat(path, ": ", config.status().message()));
  }
  return config;
}

PolicyRef PolicyTable::Intern(const ResolvedPolicy& policy) {
  auto [it, inserted] = by_value_.try_emplace(policy);
  if (inserted) it->second = MakeRef<const InternedPolicy>(policy);
  PolicyRef interned = it->second;  // held now: not dropped below
  if (by_value_.size() >= prune_at_) {
    // A copy whose only reference is the table's: no budget holds it, and none can take it but
    // through this table, under the caller's serialisation.
    absl::erase_if(by_value_, [](const auto& entry) { return entry.second.IsOnlyReference(); });
    prune_at_ = std::max<size_t>(64, 2 * by_value_.size());
  }
  return interned;
}

}  // namespace retrybudget
