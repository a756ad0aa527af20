#include "tools/budgetctl/budgetctl_commands.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
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

std::string PolicySummary(const v1::BudgetPolicy& p) {
  return absl::StrCat("capacity ", Num(p.capacity()), ", refill ", Num(p.refill_per_second()),
                      "/s, credit ", Num(p.success_credit()), " per success, initial ",
                      Num(p.initial_tokens()), ", lease ", p.lease_ttl_ms(), " ms");
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
  rows.push_back({"TENANT", "TOKENS", "CAPACITY", "REFILL/S", "CREDIT", "LEASE_MS", "ACTIVE",
                  "GRANTED", "RETRIES", "DENIED", "SUCCESSES", "FALLBACK", "POLICY"});
  for (const v1::BudgetStatus& b : budgets) {
    rows.push_back({b.tenant(), absl::StrFormat("%.1f", b.tokens()),
                    Num(b.policy().capacity()), Num(b.policy().refill_per_second()),
                    Num(b.policy().success_credit()), absl::StrCat(b.policy().lease_ttl_ms()),
                    absl::StrCat(b.active_instances()), absl::StrCat(b.granted_total()),
                    absl::StrCat(b.retries_total()), absl::StrCat(b.retries_denied_total()),
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
      // Tenant and policy left-aligned, numbers right-aligned.
      const bool left = i == 0 || i + 1 == row.size();
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
  return absl::StrCat(
      "tenant:            ", b.tenant(), "\n",
      "policy:            ", PolicySummary(b.policy()),
      b.explicit_policy() ? " (explicit)" : " (default policy)", "\n",
      "tokens:            ", absl::StrFormat("%.2f", b.tokens()), " / ",
      Num(b.policy().capacity()), "\n",
      "active instances:  ", b.active_instances(), "\n",
      "granted tokens:    ", b.granted_total(), "\n",
      "wanted tokens:     ", b.wanted_total(), "\n",
      "retries:           ", b.retries_total(), " sent (", b.fallback_retries_total(),
      " from fallback; ", b.refunded_total(), " more refunded unsent)\n",
      "retries denied:    ", b.retries_denied_total(), "\n",
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
  v1::PutPolicyRequest request;
  request.set_tenant(inv.tenant);
  v1::BudgetPolicy& p = *request.mutable_policy();
  if (inv.policy.capacity) p.set_capacity(*inv.policy.capacity);
  if (inv.policy.refill_per_second) p.set_refill_per_second(*inv.policy.refill_per_second);
  if (inv.policy.success_credit) p.set_success_credit(*inv.policy.success_credit);
  if (inv.policy.initial_tokens) p.set_initial_tokens(*inv.policy.initial_tokens);
  if (inv.policy.lease_ttl_ms) p.set_lease_ttl_ms(*inv.policy.lease_ttl_ms);
  v1::PutPolicyResponse response;
  const grpc::Status status =
      CallOwner([&](admin::AdminStub& stub, grpc::ClientContext& context) {
        return stub.PutPolicy(&context, request, &response);
      });
  if (!status.ok()) return Failed(absl::StrCat("PutPolicy(\"", inv.tenant, "\")"), status);
  if (inv.json) {
    out_ << ToJson(response.budget()) << "\n";
  } else {
    out_ << "policy of \"" << inv.tenant << "\" set: " << PolicySummary(response.budget().policy())
         << "; tokens now " << absl::StrFormat("%.2f", response.budget().tokens()) << "\n";
  }
  return kExitOk;
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
           << b.tenant() << "  tokens " << absl::StrFormat("%8.2f", b.tokens()) << " / "
           << Num(b.policy().capacity()) << "  active " << b.active_instances() << "  granted "
           << delta(b.granted_total(), &v1::BudgetStatus::granted_total) << "  retries "
           << delta(b.retries_total(), &v1::BudgetStatus::retries_total) << "  denied "
           << delta(b.retries_denied_total(), &v1::BudgetStatus::retries_denied_total)
           << "  successes " << delta(b.successes_total(), &v1::BudgetStatus::successes_total)
           << std::endl;
    }
    previous = b;
  }
  return kExitOk;
}

}  // namespace retrybudget::budgetctl
