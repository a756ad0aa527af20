// budgetctl's command line: one command, its arguments and flags, checked. No I/O.
//
//   absl::StatusOr<Invocation> inv = ParseInvocation(args, getenv);
//   if (!inv.ok()) { print inv.status().message() and the usage; exit 2 }
#ifndef RETRYBUDGET_TOOLS_BUDGETCTL_BUDGETCTL_FLAGS_H_
#define RETRYBUDGET_TOOLS_BUDGETCTL_BUDGETCTL_FLAGS_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace retrybudget::budgetctl {

// Exit codes (documented in README.md "budgetctl").
inline constexpr int kExitOk = 0;
inline constexpr int kExitRpcFailed = 1;  // the server refused the request or was unreachable
inline constexpr int kExitUsage = 2;      // bad command line (nothing was sent)

enum class Command { kHelp, kList, kGet, kPut, kMode, kDelete, kWatch, kShards };

// A budget's mode (budget.proto's Mode): enforce, or shadow (a dry run).
enum class PolicyMode { kEnforce, kShadow };

// How to reach the server.
struct Connection {
  std::string server = "127.0.0.1:50051";
  // Admin bearer token; empty sends none. From --token, else $RETRY_BUDGET_TOKEN.
  std::string token;
  // PEM files. TLS is used when tls_ca is set; tls_cert + tls_key add a client certificate.
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  // Deadline of each RPC.
  absl::Duration timeout = absl::Seconds(10);
};

// The policy fields `put` sets; unset fields take the server's defaults (budget.proto). Any of
// the windowed fields (retry_ratio, min_retries_per_second, ttl_ms) makes the policy windowed;
// the server refuses one that also sets a token bucket field.
struct PolicyFlags {
  std::optional<double> capacity;
  std::optional<double> refill_per_second;
  std::optional<double> success_credit;
  std::optional<double> initial_tokens;
  std::optional<int64_t> lease_ttl_ms;
  std::optional<PolicyMode> mode;
  std::optional<double> retry_ratio;
  std::optional<double> min_retries_per_second;
  std::optional<int64_t> ttl_ms;
  // --only: change just the fields set above (an update_mask naming them), keeping every other
  // field of the tenant's current policy, in one atomic step on the server.
  bool only = false;
};

struct Invocation {
  Command command = Command::kHelp;
  // The TENANT argument of get/put/mode/delete/watch.
  std::string tenant;
  // The MODE argument of `mode TENANT MODE`.
  PolicyMode mode = PolicyMode::kEnforce;
  Connection connection;
  bool json = false;
  PolicyFlags policy;
  // watch: time between samples, and how many samples (0: until Ctrl-C).
  absl::Duration interval = absl::Seconds(1);
  int64_t count = 0;
};

// The usage text (for --help and after a usage error).
const char* Usage();

// Parses argv[1..] (`args`). Flags may come before or after the command, as --name=value or
// --name value; `-` and `_` are the same in names. `getenv` reads RETRY_BUDGET_TOKEN and
// RETRY_BUDGET_SERVER (null means none). INVALID_ARGUMENT naming the argument and the value for
// anything wrong: unknown command or flag, a flag the command does not take, a missing or extra
// argument, a malformed number, a mode other than enforce or shadow, --only with no policy
// flag.
absl::StatusOr<Invocation> ParseInvocation(
    const std::vector<std::string>& args,
    const std::function<const char*(const char*)>& getenv);

}  // namespace retrybudget::budgetctl

#endif  // RETRYBUDGET_TOOLS_BUDGETCTL_BUDGETCTL_FLAGS_H_
