#include "tools/budgetctl/budgetctl_flags.h"

#include <algorithm>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace retrybudget::budgetctl {
namespace {

// A flag's canonical name ("lease-ttl-ms") and whether it takes a value.
struct FlagSpec {
  const char* name;
  bool takes_value;
};

constexpr FlagSpec kFlags[] = {
    {"server", true},   {"token", true},        {"tls-ca", true},   {"tls-cert", true},
    {"tls-key", true},  {"timeout", true},      {"json", false},    {"capacity", true},
    {"refill", true},   {"credit", true},       {"initial", true},  {"lease-ttl-ms", true},
    {"interval", true}, {"count", true},        {"help", false},    {"mode", true},
    {"retry-ratio", true}, {"min-retries-per-second", true}, {"ttl-ms", true},
    {"only", false},
};

const FlagSpec* FindFlag(absl::string_view name) {
  for (const FlagSpec& f : kFlags) {
    if (name == f.name) return &f;
  }
  return nullptr;
}

// The flags each command accepts on top of the connection flags.
std::set<std::string> CommandFlags(Command c) {
  switch (c) {
    case Command::kList:
    case Command::kGet:
    case Command::kShards:
      return {"json"};
    case Command::kPut:
      return {"json", "capacity", "refill", "credit", "initial", "lease-ttl-ms", "mode",
              "retry-ratio", "min-retries-per-second", "ttl-ms", "only"};
    case Command::kMode:
      return {"json"};
    case Command::kDelete:
      return {};
    case Command::kWatch:
      return {"json", "interval", "count"};
    case Command::kHelp:
      return {};
  }
  return {};
}

absl::StatusOr<double> ParseDouble(absl::string_view flag, absl::string_view value) {
  double d = 0;
  if (!absl::SimpleAtod(value, &d)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "=\"", value, "\" is not a number"));
  }
  return d;
}

absl::StatusOr<int64_t> ParseInt(absl::string_view flag, absl::string_view value) {
  int64_t i = 0;
  if (!absl::SimpleAtoi(value, &i)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "=\"", value, "\" is not an integer"));
  }
  return i;
}

absl::StatusOr<absl::Duration> ParsePositiveDuration(absl::string_view flag,
                                                     absl::string_view value) {
  absl::Duration d;
  // A bare number is seconds.
  double seconds = 0;
  if (absl::SimpleAtod(value, &seconds)) {
    d = absl::Seconds(seconds);
  } else if (!absl::ParseDuration(value, &d)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag, "=\"", value, "\" is not a duration (e.g. 500ms, 2s, 1.5)"));
  }
  if (d <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, "=\"", value, "\" must be > 0"));
  }
  return d;
}

// `what` names where the word came from (a flag or an argument) in the error.
absl::StatusOr<PolicyMode> ParseMode(absl::string_view what, absl::string_view word) {
  if (word == "enforce") return PolicyMode::kEnforce;
  if (word == "shadow") return PolicyMode::kShadow;
  return absl::InvalidArgumentError(
      absl::StrCat(what, "\"", word, "\" is not a mode (enforce or shadow)"));
}

// Positional arguments after the command word.
size_t ArgumentsOf(Command c) {
  switch (c) {
    case Command::kList:
    case Command::kShards:
    case Command::kHelp:
      return 0;
    case Command::kMode:
      return 2;
    default:
      return 1;
  }
}

absl::StatusOr<Command> ParseCommand(absl::string_view word) {
  if (word == "list") return Command::kList;
  if (word == "get") return Command::kGet;
  if (word == "put") return Command::kPut;
  if (word == "mode") return Command::kMode;
  if (word == "delete") return Command::kDelete;
  if (word == "watch") return Command::kWatch;
  if (word == "shards") return Command::kShards;
  if (word == "help") return Command::kHelp;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown command \"", word,
      "\" (commands: list, get, put, mode, delete, watch, shards, help)"));
}

bool HasPolicyField(const PolicyFlags& f) {
  return f.capacity || f.refill_per_second || f.success_credit || f.initial_tokens ||
         f.lease_ttl_ms || f.mode || f.retry_ratio || f.min_retries_per_second || f.ttl_ms;
}

}  // namespace

const char* Usage() {
  return R"(Usage: budgetctl COMMAND [ARGS] [FLAGS]

Commands:
  list                        every budget, as a table (--json: JSON)
  get TENANT                  one budget: policy, level, instances, totals (--json: JSON)
  put TENANT [POLICY FLAGS]   create a budget or change its policy (the level is kept, capped
                              at the new capacity); unset fields take the server's defaults
                              (the mode too: enforce)
      --only                  change just the fields given, keeping the rest of the current
                              policy (one atomic update on the server: a policy put meanwhile
                              by someone else is never half overwritten); at least one policy
                              flag
      --capacity=TOKENS --refill=TOKENS_PER_S --credit=TOKENS_PER_SUCCESS
      --initial=TOKENS --lease-ttl-ms=MS
                              the token bucket shape, or the windowed ratio shape (Linkerd's
                              retryBudget; setting any makes the policy windowed, and then no
                              token bucket flag may be set):
      --retry-ratio=R --min-retries-per-second=F --ttl-ms=MS
      --mode=enforce|shadow   shadow: a dry run (clients allow every retry and count the ones
                              enforcement would deny); default enforce
  mode TENANT enforce|shadow  switch only the mode, keeping the rest of the current policy
                              (one atomic update, as put --only --mode=...); creates the
                              budget (the rest default) if it has none
  delete TENANT               forget a budget and its explicit policy
  watch TENANT                print the level live, one line per sample, until Ctrl-C
      --interval=1s           time between samples
      --count=N               stop after N samples
  shards                      cluster mode: each shard and its owner, as the server sees them
                              (--json: JSON)

Connection flags (any command):
  --server=HOST:PORT          budget server (default 127.0.0.1:50051, or $RETRY_BUDGET_SERVER)
  --token=TOKEN               admin bearer token (default $RETRY_BUDGET_TOKEN); sent as
                              `authorization: Bearer TOKEN`
  --tls_ca=PEM                use TLS, trusting this CA; --tls_cert=PEM --tls_key=PEM add a
                              client certificate (mutual TLS)
  --timeout=10s               deadline of each RPC; get, put, mode, delete and watch also retry
                              UNAVAILABLE (no owner of the tenant's shard yet, a server that
                              is not up) with backoff for this long

Cluster mode: get, put, mode, delete and watch go through any server to the tenant's owner (a
non-owner names it in the trailing metadata retry-budget-owner).

Exit codes: 0 ok; 1 the server refused the request or could not be reached (the gRPC status
code and message are printed); 2 bad command line (nothing was sent).
)";
}

absl::StatusOr<Invocation> ParseInvocation(
    const std::vector<std::string>& args,
    const std::function<const char*(const char*)>& getenv) {
  Invocation inv;
  if (getenv) {
    if (const char* t = getenv("RETRY_BUDGET_TOKEN"); t != nullptr) inv.connection.token = t;
    if (const char* s = getenv("RETRY_BUDGET_SERVER"); s != nullptr && *s != '\0') {
      inv.connection.server = s;
    }
  }

  std::vector<std::string> positional;
  std::vector<std::pair<std::string, std::string>> flags;  // canonical name, value
  bool only_positional = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (only_positional || arg.size() < 2 || arg[0] != '-') {
      positional.push_back(arg);
      continue;
    }
    if (arg == "--") {
      only_positional = true;
      continue;
    }
    absl::string_view body = arg;
    if (!absl::ConsumePrefix(&body, "--")) absl::ConsumePrefix(&body, "-");
    std::string name;
    std::optional<std::string> value;
    if (const size_t eq = body.find('='); eq != absl::string_view::npos) {
      name = std::string(body.substr(0, eq));
      value = std::string(body.substr(eq + 1));
    } else {
      name = std::string(body);
    }
    name = absl::StrReplaceAll(name, {{"_", "-"}});
    if (name == "h") name = "help";
    const FlagSpec* spec = FindFlag(name);
    if (spec == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag \"", arg, "\""));
    }
    if (spec->takes_value && !value) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(absl::StrCat("flag --", name, " needs a value"));
      }
      value = args[++i];
    }
    if (!spec->takes_value) {
      if (value && *value != "true" && *value != "false") {
        return absl::InvalidArgumentError(
            absl::StrCat("flag --", name, " takes no value (got \"", *value, "\")"));
      }
      value = value.value_or("true");
    }
    flags.emplace_back(name, *value);
  }

  const bool help = std::any_of(flags.begin(), flags.end(), [](const auto& f) {
    return f.first == "help" && f.second == "true";
  });
  if (positional.empty()) {
    if (help) return inv;  // kHelp
    return absl::InvalidArgumentError("no command given");
  }
  absl::StatusOr<Command> command = ParseCommand(positional[0]);
  if (!command.ok()) return command.status();
  inv.command = *command;
  if (help || inv.command == Command::kHelp) {
    inv.command = Command::kHelp;
    return inv;
  }

  const bool takes_tenant = ArgumentsOf(inv.command) > 0;
  const size_t want_args = 1 + ArgumentsOf(inv.command);
  if (positional.size() < want_args) {
    return absl::InvalidArgumentError(absl::StrCat(
        "command \"", positional[0], "\" needs ",
        inv.command == Command::kMode ? "TENANT and MODE arguments" : "a TENANT argument"));
  }
  if (positional.size() > want_args) {
    return absl::InvalidArgumentError(absl::StrCat("unexpected argument \"",
                                                   positional[want_args], "\" after \"",
                                                   absl::StrJoin(positional.begin(),
                                                                 positional.begin() + want_args,
                                                                 " "),
                                                   "\""));
  }
  if (takes_tenant) {
    inv.tenant = positional[1];
    if (inv.tenant.empty()) return absl::InvalidArgumentError("TENANT must not be empty");
  }
  if (inv.command == Command::kMode) {
    absl::StatusOr<PolicyMode> mode = ParseMode("MODE ", positional[2]);
    if (!mode.ok()) return mode.status();
    inv.mode = *mode;
  }

  const std::set<std::string> allowed = CommandFlags(inv.command);
  for (const auto& [name, value] : flags) {
    if (name == "server") {
      inv.connection.server = value;
    } else if (name == "token") {
      inv.connection.token = value;
    } else if (name == "tls-ca") {
      inv.connection.tls_ca = value;
    } else if (name == "tls-cert") {
      inv.connection.tls_cert = value;
    } else if (name == "tls-key") {
      inv.connection.tls_key = value;
    } else if (name == "timeout") {
      absl::StatusOr<absl::Duration> d = ParsePositiveDuration(name, value);
      if (!d.ok()) return d.status();
      inv.connection.timeout = *d;
    } else if (!allowed.contains(name)) {
      return absl::InvalidArgumentError(absl::StrCat("flag --", name,
                                                     " does not apply to command \"",
                                                     positional[0], "\""));
    } else if (name == "json") {
      inv.json = value == "true";
    } else if (name == "capacity" || name == "refill" || name == "credit" ||
               name == "initial") {
      absl::StatusOr<double> d = ParseDouble(name, value);
      if (!d.ok()) return d.status();
      if (name == "capacity") inv.policy.capacity = *d;
      if (name == "refill") inv.policy.refill_per_second = *d;
      if (name == "credit") inv.policy.success_credit = *d;
      if (name == "initial") inv.policy.initial_tokens = *d;
    } else if (name == "retry-ratio" || name == "min-retries-per-second") {
      absl::StatusOr<double> d = ParseDouble(name, value);
      if (!d.ok()) return d.status();
      (name == "retry-ratio" ? inv.policy.retry_ratio : inv.policy.min_retries_per_second) = *d;
    } else if (name == "lease-ttl-ms" || name == "ttl-ms") {
      absl::StatusOr<int64_t> i = ParseInt(name, value);
      if (!i.ok()) return i.status();
      (name == "ttl-ms" ? inv.policy.ttl_ms : inv.policy.lease_ttl_ms) = *i;
    } else if (name == "mode") {
      absl::StatusOr<PolicyMode> mode = ParseMode("--mode=", value);
      if (!mode.ok()) return mode.status();
      inv.policy.mode = *mode;
    } else if (name == "only") {
      inv.policy.only = value == "true";
    } else if (name == "interval") {
      absl::StatusOr<absl::Duration> d = ParsePositiveDuration(name, value);
      if (!d.ok()) return d.status();
      inv.interval = *d;
    } else if (name == "count") {
      absl::StatusOr<int64_t> i = ParseInt(name, value);
      if (!i.ok()) return i.status();
      if (*i < 1) {
        return absl::InvalidArgumentError(absl::StrCat("--count=", *i, " must be >= 1"));
      }
      inv.count = *i;
    }
  }
  if (inv.policy.only && !HasPolicyField(inv.policy)) {
    return absl::InvalidArgumentError(
        "--only changes just the policy flags given, and none was given (e.g. --capacity=50)");
  }
  if (inv.connection.server.empty()) {
    return absl::InvalidArgumentError("--server must not be empty");
  }
  if (inv.connection.tls_cert.empty() != inv.connection.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together");
  }
  if (!inv.connection.tls_cert.empty() && inv.connection.tls_ca.empty()) {
    return absl::InvalidArgumentError("--tls_cert needs --tls_ca (the server's CA)");
  }
  return inv;
}

}  // namespace retrybudget::budgetctl
