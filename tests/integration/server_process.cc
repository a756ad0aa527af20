#include "tests/integration/server_process.h"

#include <signal.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"

#ifndef RETRY_BUDGET_SERVER_BINARY
#error "RETRY_BUDGET_SERVER_BINARY must name the retry-budget-server binary"
#endif

namespace retrybudget::testing {
namespace {

constexpr absl::Duration kStartTimeout = absl::Seconds(20);
constexpr absl::Duration kExitTimeout = absl::Seconds(20);

}  // namespace

const std::string& ServerBinary() {
  static const std::string* const binary = new std::string(RETRY_BUDGET_SERVER_BINARY);
  return *binary;
}

std::unique_ptr<ServerProcess> ServerProcess::Start(const std::string& dir,
                                                    std::vector<std::string> args) {
  std::unique_ptr<ServerProcess> s(new ServerProcess());
  // A fresh log per start, as the tests read it (the launcher appends across restarts).
  std::remove((dir + "/output").c_str());
  // Metrics off (the launcher's default): parallel test servers must not compete for the default
  // metrics port.
  absl::StatusOr<std::unique_ptr<ServerUnderTest>> server =
      ServerUnderTest::Start({.binary = ServerBinary(),
                              .flags = std::move(args),
                              .dir = dir,
                              .log_name = "output",
                              .timeout = kStartTimeout});
  if (!server.ok()) {
    ADD_FAILURE() << "the server did not serve: " << server.status();
    return nullptr;
  }
  s->server_ = *std::move(server);
  return s;
}

std::string ServerProcess::target() const { return server_->address(); }

pid_t ServerProcess::pid() const { return server_->pid(); }

ServerConnection ServerProcess::Connect(std::string bearer_token) const {
  return ServerConnection::Create(target(), grpc::InsecureChannelCredentials(),
                                  std::move(bearer_token));
}

std::optional<int> ServerProcess::Stop(int signo) {
  server_->Signal(signo);
  return server_->WaitForExit(kExitTimeout);
}

int64_t ServerProcess::ResidentBytes() const {
  std::ifstream in(absl::StrCat("/proc/", pid(), "/status"));
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view v = line;
    if (absl::ConsumePrefix(&v, "VmRSS:")) {
      v = absl::StripAsciiWhitespace(v);
      absl::ConsumeSuffix(&v, " kB");
      int64_t kb = 0;
      if (absl::SimpleAtoi(v, &kb)) return kb * 1024;
    }
  }
  return 0;
}

ExitResult RunToExit(const std::string& dir, std::vector<std::string> args) {
  std::vector<std::string> all = {"--listen=127.0.0.1:0", "--metrics_listen="};
  all.insert(all.end(), args.begin(), args.end());
  std::optional<ChildProcess> process = ChildProcess::Start(ServerBinary(), all, dir + "/output");
  if (!process) return {};
  ExitResult result;
  result.code = process->Wait(kExitTimeout);
  result.output = process->Output();
  return result;
}

v1::SyncRequest SyncOf(absl::string_view instance, uint64_t seq, absl::string_view tenant,
                       uint64_t want, uint64_t received, uint64_t returned, uint64_t spent) {
  v1::SyncRequest r;
  r.set_instance_id(std::string(instance));
  r.set_seq(seq);
  v1::TenantSync* t = r.add_tenants();
  t->set_tenant(std::string(tenant));
  t->set_want(want);
  t->set_tokens_received(received);
  t->set_tokens_returned(returned);
  t->set_retries_spent(spent);
  return r;
}

void WriteFile(const std::string& path, absl::string_view contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << contents;
  out.close();
  if (!out) ADD_FAILURE() << "cannot write " << path;
}

}  // namespace retrybudget::testing
