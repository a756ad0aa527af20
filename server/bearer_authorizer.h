// Per-tenant bearer credentials (the `credentials` of the policy file) as a RequestAuthorizer.
//
//   auto authorizer = BearerAuthorizer::Create(policy, {.log = [](absl::string_view line) {
//     spdlog::warn("{}", std::string(line));
//   }});
//   ServiceOptions service{.core = core, .authorizer = authorizer->get()};
//   ...  // SIGHUP:
//   (*authorizer)->Replace(new_policy);
//
// Rules (budget.proto, PolicyConfig.credentials):
//  * no credential configured: every call is allowed (the embedded default);
//  * otherwise every RPC must carry `authorization: Bearer <token>` metadata whose SHA-256 is
//    a configured token_sha256: a missing, malformed or unknown token is UNAUTHENTICATED;
//  * Sync: every tenant the request names must be in the credential's `tenants`, else
//    PERMISSION_DENIED for the whole request (an admin credential may Sync only the tenants it
//    lists too: admin is about BudgetAdminService, not about spending);
//  * BudgetAdminService (every RPC, reads included): the credential must be `admin`, else
//    PERMISSION_DENIED.
// Tokens are compared by their SHA-256, in constant time; a token is never logged or returned in
// an error, only the credential's name.
#ifndef RETRYBUDGET_SERVER_BEARER_AUTHORIZER_H_
#define RETRYBUDGET_SERVER_BEARER_AUTHORIZER_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "retrybudget/clock.h"
#include "retrybudget/mutex.h"
#include "retrybudget/v1/budget.pb.h"
#include "server/service.h"

namespace retrybudget {

struct BearerAuthorizerOptions {
  // Receives one line per refusal, at most one per credential (and one for "no token", one for
  // "unknown token") per `log_interval`. Never contains a token. Null: refusals are not logged.
  std::function<void(absl::string_view line)> log;
  absl::Duration log_interval = absl::Minutes(1);
  // For the log rate limit; Clock::Real() if null. Not owned.
  Clock* clock = nullptr;
};

// SHA-256 of `data` (OpenSSL libcrypto).
std::array<uint8_t, 32> Sha256(absl::string_view data);

// Thread-safe. Authorize() takes a lock only to copy a shared_ptr (and, on a refusal, for the log
// rate limit); Replace() swaps the whole credential set at once, so a call sees either the old
// set or the new one, never a mix.
class BearerAuthorizer final : public RequestAuthorizer {
 public:
  // INVALID_ARGUMENT (from ValidateCredentials) if the credentials are invalid.
  static absl::StatusOr<std::unique_ptr<BearerAuthorizer>> Create(
      const v1::PolicyConfig& config, BearerAuthorizerOptions options = {});

  absl::Status Authorize(const grpc::ServerContextBase& context, Rpc rpc,
                         absl::Span<const absl::string_view> tenants) override;
  // The principal is the credential's name when credentials are configured, else "".
  absl::Status Authorize(const grpc::ServerContextBase& context, Rpc rpc,
                         absl::Span<const absl::string_view> tenants,
                         std::string* principal) override;

  // Installs the credentials of `config`. INVALID_ARGUMENT (and the old set stays) if invalid.
  absl::Status Replace(const v1::PolicyConfig& config);

  // Number of credentials configured (0: everything is allowed) and of them admin ones.
  size_t credential_count();
  size_t admin_count();

 private:
  struct Credential {
    std::string name;
    std::array<uint8_t, 32> token_sha256;
    absl::flat_hash_set<std::string> tenants;
    bool admin = false;
  };
  using CredentialSet = std::vector<Credential>;

  explicit BearerAuthorizer(BearerAuthorizerOptions options);
  static absl::StatusOr<std::shared_ptr<const CredentialSet>> Build(
      const v1::PolicyConfig& config);
  std::shared_ptr<const CredentialSet> current();
  // Logs `line` unless a line for `key` was logged within the interval; returns `status`.
  absl::Status Refuse(absl::string_view key, absl::Status status);

  const BearerAuthorizerOptions options_;
  Clock* const clock_;

  Mutex mu_;
  std::shared_ptr<const CredentialSet> credentials_ ABSL_GUARDED_BY(mu_);

  // Keys are credential names plus two fixed ones, so the map stays as small as the policy
  // (names of credentials removed by a reload stay until the process ends: a few bytes each).
  Mutex log_mu_;
  absl::flat_hash_map<std::string, absl::Time> last_logged_ ABSL_GUARDED_BY(log_mu_);
  absl::flat_hash_map<std::string, uint64_t> suppressed_ ABSL_GUARDED_BY(log_mu_);
};

}  // namespace retrybudget

#endif  // RETRYBUDGET_SERVER_BEARER_AUTHORIZER_H_
