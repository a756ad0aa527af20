#include "tools/budgetctl/budgetctl_commands.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/util/json_util.h"

namespace retrybudget::budgetctl {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", path, ": cannot read"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// "12.5" rather than "12.500000"; integers without a fraction.
std::string Num(double v) { return absl::StrFormat("%.6g", v); }

std::string CodeName(grpc::StatusCode code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

bool Windowed(const v1::BudgetPolicy& p) {
  return p.has_retry_ratio() || p.has_min_retries_per_second() || p.has_ttl_ms();
}

std::string ModeName(v1::Mode mode) { return mode == v1::MODE_SHADOW ? "shadow" : "enforce"; }

// The policy's shape and fields (a status's policy has every field of its shape set).
std::string PolicySummary(const v1::BudgetPolicy& p) {
  const std::string shape =
      Windowed(p) ? absl::StrCat("windowed: retry ratio ", Num(p.retry_ratio()), ", min ",
                                 Num(p.min_retries_per_second()), " retries/s, ttl ",
                                 p.ttl_ms(), " ms")
                  : absl::StrCat("capacity ", Num(p.capacity()), ", refill ",
                                 Num(p.refill_per_second()), "/s, credit ",
                                 Num(p.success_credit()), " per success, initial ",
                                 Num(p.initial_tokens()));
  return absl::StrCat(shape, ", lease ", p.lease_ttl_ms(), " ms");
}

// A shape's field in the table: "-" where the tenant's shape has no such field.
std::string Field(bool applies, double v) { return applies ? Num(v) : "-"; }

// Tokens per retry allowed ("-" before any).
std::string MeanCost(const v1::BudgetStatus& b) {
  if (b.retries_allowed_total() == 0) return "-";
  return Num(static_cast<double>(b.retries_total() + b.refunded_total()) /
             static_cast<double>(b.retries_allowed_total()));
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentialsFor(
    const Connection& connection) {
  if (connection.tls_ca.empty()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  absl::StatusOr<std::string> ca = ReadFile("tls_ca", connection.tls_ca);
  if (!ca.ok()) return ca.status();
  options.pem_root_certs = *std::move(ca);
  if (!connection.tls_cert.empty()) {
    absl::StatusOr<std::string> cert = ReadFile("tls_cert", connection.tls_cert);
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadFile("tls_key", connection.tls_key);
    if (!key.ok()) return key.status();
    options.pem_cert_chain = *std::move(cert);
    options.pem_private_key = *std::move(key);
  }
  return grpc::SslCredentials(options);
}

std::string FormatTable(const std::vector<v1::BudgetStatus>& budgets) {
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"TENANT", "MODE", "TOKENS", "CAPACITY", "REFILL/S", "CREDIT", "RATIO",
                  "MIN/S", "TTL_MS", "LEASE_MS", "ACTIVE", "GRANTED", "REQUESTS", "RETRIES",
                  "ALLOWED", "DENIED", "SHADOW_DENIED", "SUCCESSES", "FALLBACK", "POLICY"});
  for (const v1::BudgetStatus& b : budgets) {
    const v1::BudgetPolicy& p = b.policy();
    const bool windowed = Windowed(p);
    rows.push_back({b.tenant(), ModeName(p.mode()), absl::StrFormat("%.1f", b.tokens()),
                    Field(!windowed, p.capacity()), Field(!windowed, p.refill_per_second()),
                    Field(!windowed, p.success_credit()), Field(windowed, p.retry_ratio()),
                    Field(windowed, p.min_retries_per_second()),
                    Field(windowed, static_cast<double>(p.ttl_ms())),
                    absl::StrCat(p.lease_ttl_ms()), absl::StrCat(b.active_instances()),
                    absl::StrCat(b.granted_total()), absl::StrCat(b.requests_total()),
                    absl::StrCat(b.retries_total()), absl::StrCat(b.retries_allowed_total()),
                    absl::StrCat(b.retries_denied_total()), absl::StrCat(b.shadow_denied_total()),
                    absl::StrCat(b.successes_total()), absl::StrCat(b.fallback_retries_total()),
                    b.explicit_policy() ? "explicit" : "default"});
  }
  std::vector<size_t> widths(rows[0].size(), 0);
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  std::string table;
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      // Tenant, mode and policy left-aligned, numbers right-aligned.
      const bool left = i <= 1 || i + 1 == row.size();
      if (i > 0) line += "  ";
      line += left ? absl::StrFormat("%-*s", widths[i], row[i])
                   : absl::StrFormat("%*s", widths[i], row[i]);
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    absl::StrAppend(&table, line, "\n");
  }
  if (budgets.empty()) absl::StrAppend(&table, "(no budgets)\n");
  return table;
}

std::string FormatBudget(const v1::BudgetStatus& b) {
  const v1::BudgetPolicy& p = b.policy();
  const bool windowed = Windowed(p);
  // A windowed budget's level is what may be granted now: the floor of one window plus the
  // live deposits, less the live grants.
  const std::string level =
      windowed ? absl::StrCat(absl::StrFormat("%.2f", b.tokens()), " grantable now (deposits ",
                              absl::StrFormat("%.2f", b.window_deposits()),
                              " within the last ttl)")
               : absl::StrCat(absl::StrFormat("%.2f", b.tokens()), " / ", Num(p.capacity()));
  const std::string mode =
      p.mode() == v1::MODE_SHADOW
          ? "shadow (a dry run: clients allow every retry and count the would-be denials)"
          : "enforce";
  return absl::StrCat(
      "tenant:            ", b.tenant(), "\n",
      "mode:              ", mode, "\n",
      "policy:            ", PolicySummary(p),
      b.explicit_policy() ? " (explicit)" : " (default policy)", "\n",
      "tokens:            ", level, "\n",
      "active instances:  ", b.active_instances(), "\n",
      "granted tokens:    ", b.granted_total(), "\n",
      "wanted tokens:     ", b.wanted_total(), "\n",
      "requests:          ", b.requests_total(), "\n",
      "retries:           ", b.retries_total(), " tokens sent (", b.fallback_retries_total(),
      " from fallback; ", b.refunded_total(), " more refunded unsent)\n",
      "retries allowed:   ", b.retries_allowed_total(), " (mean cost ", MeanCost(b),
      " tokens)\n",
      "retries denied:    ", b.retries_denied_total(), "\n",
      "shadow denied:     ", b.shadow_denied_total(),
      " (would-be denials: allowed in shadow mode, denied if enforced)\n",
      "successes:         ", b.successes_total(), "\n",
      "returned tokens:   ", b.returned_total(), "\n",
      "reclaimed tokens:  ", b.reclaimed_total(), "\n");
}

std::string ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  return json;
}

Commands::Commands(v1::BudgetAdminService::StubInterface& stub, Connection connection,
                   std::ostream& out, std::ostream& err, admin::AdminStubFactory owner_stubs)
    : stub_(stub),
      connection_(std::move(connection)),
      owner_stubs_(std::move(owner_stubs)),
      out_(out),
      err_(err) {
  if (owner_stubs_ == nullptr) {
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
        ChannelCredentialsFor(connection_);
    if (credentials.ok()) owner_stubs_ = admin::OwnerStubsWith(*std::move(credentials));
  }
}

grpc::Status Commands::CallOwner(const admin::AdminAttempt& attempt) {
  auto setup = [this](grpc::ClientContext& context) {
    context.set_deadline(absl::ToChronoTime(absl::Now() + connection_.timeout));
    if (!connection_.token.empty()) {
      context.AddMetadata("authorization", absl::StrCat("Bearer ", connection_.token));
    }
  };
  return admin::CallFollowingOwner(stub_, owner_stubs_, setup, attempt,
                                   {.unavailable_for = connection_.timeout})
      .status;
}

std::unique_ptr<grpc::ClientContext> Commands::NewContext() const {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + connection_.timeout));
  if (!connection_.token.empty()) {
    context->AddMetadata("authorization", absl::StrCat("Bearer ", connection_.token));
  }
  return context;
}

int Commands::Failed(const std::string& what, const grpc::Status& status) {
  err_ << "budgetctl: " << what << " failed: " << CodeName(status.error_code()) << ": "
       << status.error_message() << "\n";
  if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
    err_ << "budgetctl: hint: pass the admin token with --token or $RETRY_BUDGET_TOKEN\n";
  } else if (status.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
    err_ << "budgetctl: hint: the admin API needs a credential with `admin: true`\n";
  } else if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
    err_ << "budgetctl: hint: is the server running on " << connection_.server
         << " (--server), and does it expect TLS (--tls_ca)?\n";
  }
  return kExitRpcFailed;
}

int Commands::Run(const Invocation& inv, const std::atomic<bool>& stop) {
  switch (inv.command) {
    case Command::kList:
      return List(inv);
    case Command::kGet:
      return Get(inv);
    case Command::kPut:
      return Put(inv);
    case Command::kMode:
      return SetMode(inv);
    case Command::kDelete:
      return Delete(inv);
    case Command::kWatch:
      return Watch(inv, stop);
    case Command::kShards:
      return Shards(inv);
    case Command::kHelp:
      out_ << Usage();
      return kExitOk;
  }
  return kExitOk;
}

int Commands::List(const Invocation& inv) {
  v1::ListBudgetsResponse all;
  std::string page_token;
  do {
    v1::ListBudgetsRequest request;
    request.set_page_token(page_token);
    v1::ListBudgetsResponse page;
    const grpc::Status status = stub_.ListBudgets(NewContext().get(), request, &page);
    if (!status.ok()) return Failed("ListBudgets", status);
    for (auto& b : *page.mutable_budgets()) *all.add_budgets() = std::move(b);
    page_token = page.next_page_token();
  } while (!page_token.empty());
  if (inv.json) {
    out_ << ToJson(all) << "\n";
  } else {
    out_ << FormatTable({all.budgets().begin(), all.budgets().end()});
  }
  return kExitOk;
}

int Commands::Shards(const Invocation& inv) {
  v1::ListShardsResponse response;
  const grpc::Status status =
      stub_.ListShards(NewContext().get(), v1::ListShardsRequest(), &response);
  if (!status.ok()) return Failed("ListShards", status);
  if (inv.json) {
    out_ << ToJson(response) << "\n";
    return kExitOk;
  }
  if (!response.cluster_mode()) {
    out_ << "not in cluster mode (a single server holds every budget)\n";
    return kExitOk;
  }
  out_ << absl::StrFormat("%-6s %-24s %s\n", "SHARD", "OWNER", "");
  for (const v1::ShardInfo& s : response.shards()) {
    out_ << absl::StrFormat("%-6d %-24s %s\n", s.shard(),
                            s.owner_address().empty()
                                ? (s.owner_id().empty() ? "-" : s.owner_id())
                                : s.owner_address(),
                            s.owned_here() ? "(this server)" : "");
  }
  return kExitOk;
}

int Commands::Get(const Invocation& inv) {
  v1::GetBudgetRequest request;
  request.set_tenant(inv.tenant);
  v1::GetBudgetResponse response;
  const grpc::Status status =
      CallOwner([&](admin::AdminStub& stub, grpc::ClientContext& context) {
        return stub.GetBudget(&context, request, &response);
      });
  if (!status.ok()) return Failed(absl::StrCat("GetBudget(\"", inv.tenant, "\")"), status);
  out_ << (inv.json ? ToJson(response.budget()) + "\n" : FormatBudget(response.budget()));
  return kExitOk;
}

int Commands::Put(const Invocation& inv) {
  v1::BudgetPolicy p;
  const PolicyFlags& f = inv.policy;
  if (f.capacity) p.set_capacity(*f.capacity);
  if (f.refill_per_second) p.set_refill_per_second(*f.refill_per_second);
  if (f.success_credit) p.set_success_credit(*f.success_credit);
  if (f.initial_tokens) p.set_initial_tokens(*f.initial_tokens);
  if (f.lease_ttl_ms) p.set_lease_ttl_ms(*f.lease_ttl_ms);
  if (f.retry_ratio) p.set_retry_ratio(*f.retry_ratio);
  if (f.min_retries_per_second) p.set_min_retries_per_second(*f.min_retries_per_second);
  if (f.ttl_ms) p.set_ttl_ms(*f.ttl_ms);
  if (f.mode) p.set_mode(*f.mode == PolicyMode::kShadow ? v1::MODE_SHADOW : v1::MODE_ENFORCE);
  google::protobuf::FieldMask mask;
  if (f.only) {
    // The fields the flags set (the mode too: MODE_ENFORCE is not the unset 0).
    std::vector<const google::protobuf::FieldDescriptor*> set;
    p.GetReflection()->ListFields(p, &set);
    for (const google::protobuf::FieldDescriptor* field : set) {
      mask.add_paths(std::string(field->name()));
    }
  }
  return PutPolicy(inv, p, mask);
}

int Commands::PutPolicy(const Invocation& inv, const v1::BudgetPolicy& policy,
                        const google::protobuf::FieldMask& mask) {
  v1::PutPolicyRequest request;
  request.set_tenant(inv.tenant);
  *request.mutable_policy() = policy;
  *request.mutable_update_mask() = mask;
  v1::PutPolicyResponse response;
  const grpc::Status status =
      CallOwner([&](admin::AdminStub& stub, grpc::ClientContext& context) {
        return stub.PutPolicy(&context, request, &response);
      });
  if (!status.ok()) return Failed(absl::StrCat("PutPolicy(\"", inv.tenant, "\")"), status);
  if (inv.json) {
    out_ << ToJson(response.budget()) << "\n";
  } else {
    const v1::BudgetPolicy& now = response.budget().policy();
    out_ << "policy of \"" << inv.tenant << "\" set: " << PolicySummary(now) << ", mode "
         << ModeName(now.mode()) << "; tokens now "
         << absl::StrFormat("%.2f", response.budget().tokens()) << "\n";
  }
  return kExitOk;
}

int Commands::SetMode(const Invocation& inv) {
  // Only the mode: the server keeps every other field of the current policy, atomically.
  v1::BudgetPolicy p;
  p.set_mode(inv.mode == PolicyMode::kShadow ? v1::MODE_SHADOW : v1::MODE_ENFORCE);
  google::protobuf::FieldMask mask;
  mask.add_paths("mode");
  return PutPolicy(inv, p, mask);
}

int Commands::Delete(const Invocation& inv) {
  v1::DeleteBudgetRequest request;
  request.set_tenant(inv.tenant);
  v1::DeleteBudgetResponse response;
  const grpc::Status status =
      CallOwner([&](admin::AdminStub& stub, grpc::ClientContext& context) {
        return stub.DeleteBudget(&context, request, &response);
      });
  if (!status.ok()) return Failed(absl::StrCat("DeleteBudget(\"", inv.tenant, "\")"), status);
  out_ << "budget \"" << inv.tenant << "\" deleted\n";
  return kExitOk;
}

int Commands::Watch(const Invocation& inv, const std::atomic<bool>& stop) {
  std::optional<v1::BudgetStatus> previous;
  for (int64_t sample = 0; inv.count == 0 || sample < inv.count; ++sample) {
    if (sample > 0) {
      // Sleep in short slices so Ctrl-C ends the watch promptly.
      const absl::Time wake = absl::Now() + inv.interval;
      while (!stop.load() && absl::Now() < wake) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    if (stop.load()) break;
    v1::GetBudgetRequest request;
    request.set_tenant(inv.tenant);
    v1::GetBudgetResponse response;
    const grpc::Status status =
        CallOwner([&](admin::AdminStub& stub, grpc::ClientContext& context) {
          return stub.GetBudget(&context, request, &response);
        });
    if (!status.ok()) return Failed(absl::StrCat("GetBudget(\"", inv.tenant, "\")"), status);
    const v1::BudgetStatus& b = response.budget();
    if (inv.json) {
      out_ << ToJson(b) << std::endl;
    } else {
      auto delta = [&](uint64_t now, uint64_t (v1::BudgetStatus::*field)() const) {
        const uint64_t before = previous ? ((*previous).*field)() : now;
        return absl::StrCat("+", now >= before ? now - before : 0);
      };
      out_ << absl::FormatTime("%H:%M:%S", absl::Now(), absl::LocalTimeZone()) << "  "
           << b.tenant() << "  tokens " << absl::StrFormat("%8.2f", b.tokens())
           << (Windowed(b.policy())
                   ? absl::StrCat(" grantable, deposits ",
                                  absl::StrFormat("%.2f", b.window_deposits()))
                   : absl::StrCat(" / ", Num(b.policy().capacity())))
           << "  active " << b.active_instances() << "  granted "
           << delta(b.granted_total(), &v1::BudgetStatus::granted_total) << "  retries "
           << delta(b.retries_total(), &v1::BudgetStatus::retries_total) << "  denied "
           << delta(b.retries_denied_total(), &v1::BudgetStatus::retries_denied_total)
           << "  successes " << delta(b.successes_total(), &v1::BudgetStatus::successes_total);
      if (b.policy().mode() == v1::MODE_SHADOW) {
        out_ << "  shadow-denied "
             << delta(b.shadow_denied_total(), &v1::BudgetStatus::shadow_denied_total);
      }
      out_ << std::endl;
    }
    previous = b;
  }
  return kExitOk;
}

}  // namespace retrybudget::budgetctl
