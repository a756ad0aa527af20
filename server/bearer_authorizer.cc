#include "server/bearer_authorizer.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "retrybudget/names.h"
#include "server/policy.h"

namespace retrybudget {
namespace {

// Rate-limit keys for refusals that have no credential name.
constexpr absl::string_view kNoTokenKey = "\x01no-token";
constexpr absl::string_view kUnknownTokenKey = "\x01unknown-token";

bool IsAdminRpc(Rpc rpc) { return rpc != Rpc::kSync; }

// The token of an `authorization: Bearer <token>` header; empty when absent or malformed.
// gRPC lower-cases metadata keys. Only the first authorization header counts.
absl::string_view BearerToken(const grpc::ServerContextBase& context) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) return {};
  absl::string_view value(it->second.data(), it->second.size());
  constexpr absl::string_view kScheme = "bearer ";
  if (value.size() <= kScheme.size() ||
      !absl::EqualsIgnoreCase(value.substr(0, kScheme.size()), kScheme)) {
    return {};
  }
  return absl::StripAsciiWhitespace(value.substr(kScheme.size()));
}

}  // namespace

std::array<uint8_t, 32> Sha256(absl::string_view data) {
  std::array<uint8_t, 32> digest{};
  unsigned int length = 0;
  // EVP_Digest with SHA-256 cannot fail for in-memory input short of allocation failure.
  if (EVP_Digest(data.data(), data.size(), digest.data(), &length, EVP_sha256(), nullptr) != 1 ||
      length != digest.size()) {
    abort();
  }
  return digest;
}

absl::StatusOr<std::unique_ptr<BearerAuthorizer>> BearerAuthorizer::Create(
    const v1::PolicyConfig& config, BearerAuthorizerOptions options) {
  std::unique_ptr<BearerAuthorizer> authorizer(new BearerAuthorizer(std::move(options)));
  if (absl::Status s = authorizer->Replace(config); !s.ok()) return s;
  return authorizer;
}

BearerAuthorizer::BearerAuthorizer(BearerAuthorizerOptions options)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : Clock::Real()),
      credentials_(std::make_shared<const CredentialSet>()) {}

absl::StatusOr<std::shared_ptr<const BearerAuthorizer::CredentialSet>> BearerAuthorizer::Build(
    const v1::PolicyConfig& config) {
  if (absl::Status s = ValidateCredentials(config); !s.ok()) return s;
  auto set = std::make_shared<CredentialSet>();
  set->reserve(config.credentials_size());
  for (const v1::Credential& c : config.credentials()) {
    Credential credential;
    credential.name = c.name();
    // ValidateCredentials checked: 64 lowercase hex characters.
    const std::string bytes = absl::HexStringToBytes(c.token_sha256());
    if (bytes.size() != credential.token_sha256.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("credential ", QuoteForError(c.name()), ": token_sha256 is not 32 bytes"));
    }
    std::copy(bytes.begin(), bytes.end(), credential.token_sha256.begin());
    credential.tenants.insert(c.tenants().begin(), c.tenants().end());
    credential.admin = c.admin();
    set->push_back(std::move(credential));
  }
  return std::shared_ptr<const CredentialSet>(std::move(set));
}

absl::Status BearerAuthorizer::Replace(const v1::PolicyConfig& config) {
  absl::StatusOr<std::shared_ptr<const CredentialSet>> set = Build(config);
  if (!set.ok()) return set.status();
  MutexLock lock(&mu_);
  credentials_ = *std::move(set);
  return absl::OkStatus();
}

std::shared_ptr<const BearerAuthorizer::CredentialSet> BearerAuthorizer::current() {
  ReaderMutexLock lock(&mu_);
  return credentials_;
}

size_t BearerAuthorizer::credential_count() { return current()->size(); }

size_t BearerAuthorizer::admin_count() {
  size_t n = 0;
  for (const Credential& c : *current()) n += c.admin ? 1 : 0;
  return n;
}

absl::Status BearerAuthorizer::Authorize(const grpc::ServerContextBase& context, Rpc rpc,
                                         absl::Span<const absl::string_view> tenants) {
  std::string principal;
  return Authorize(context, rpc, tenants, &principal);
}

absl::Status BearerAuthorizer::Authorize(const grpc::ServerContextBase& context, Rpc rpc,
                                         absl::Span<const absl::string_view> tenants,
                                         std::string* principal) {
  principal->clear();
  const std::shared_ptr<const CredentialSet> credentials = current();
  if (credentials->empty()) return absl::OkStatus();

  const absl::string_view token = BearerToken(context);
  if (token.empty()) {
    return Refuse(kNoTokenKey,
                  absl::UnauthenticatedError(absl::StrCat(
                      RpcName(rpc), " refused: no `authorization: Bearer <token>` metadata, and "
                                    "this server requires a credential")));
  }
  // Compare against every credential, in constant time each and without stopping at a match,
  // so the time taken says nothing about which hash (or how much of it) matched.
  const std::array<uint8_t, 32> digest = Sha256(token);
  const Credential* found = nullptr;
  for (const Credential& c : *credentials) {
    const bool match =
        CRYPTO_memcmp(digest.data(), c.token_sha256.data(), digest.size()) == 0;
    if (match) found = &c;
  }
  if (found == nullptr) {
    return Refuse(kUnknownTokenKey,
                  absl::UnauthenticatedError(absl::StrCat(
                      RpcName(rpc), " refused: the bearer token matches no credential")));
  }

  if (IsAdminRpc(rpc)) {
    if (!found->admin) {
      return Refuse(found->name,
                    absl::PermissionDeniedError(absl::StrCat(
                        RpcName(rpc), " refused: credential ", QuoteForError(found->name),
                        " is not an admin credential (BudgetAdminService needs one)")));
    }
    return absl::OkStatus();
  }
  for (absl::string_view tenant : tenants) {
    if (!found->tenants.contains(tenant)) {
      return Refuse(found->name,
                    absl::PermissionDeniedError(absl::StrCat(
                        RpcName(rpc), " refused: credential ", QuoteForError(found->name),
                        " does not cover tenant ", QuoteForError(tenant),
                        "; nothing in the request was applied")));
    }
  }
  *principal = found->name;  // names are non-empty and unique: "" stays anonymous
  return absl::OkStatus();
}

absl::Status BearerAuthorizer::Refuse(absl::string_view key, absl::Status status) {
  if (!options_.log) return status;
  const absl::Time now = clock_->Now();
  uint64_t suppressed = 0;
  {
    MutexLock lock(&log_mu_);
    auto [it, inserted] = last_logged_.try_emplace(key, now);
    if (!inserted) {
      if (now - it->second < options_.log_interval) {
        ++suppressed_[key];
        return status;
      }
      it->second = now;
    }
    auto s = suppressed_.find(key);
    if (s != suppressed_.end()) {
      suppressed = s->second;
      suppressed_.erase(s);
    }
  }
  std::string line = absl::StrCat("auth: ", status.message());
  if (suppressed > 0) {
    absl::StrAppend(&line, " (and ", suppressed, " similar refusal(s) not logged in the last ",
                    absl::FormatDuration(options_.log_interval), ")");
  }
  options_.log(line);
  return status;
}

}  // namespace retrybudget
