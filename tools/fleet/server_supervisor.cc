#include "tools/fleet/server_supervisor.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace retrybudget::fleet {
namespace {

constexpr int kServerExitCannotServe = 1;  // server/main.cc: address in use, port file

// The port in `path`, once the server has written it (atomically, temp file + rename).
std::optional<int> ReadPortFile(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!in || !std::getline(in, text)) return std::nullopt;
  int port = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &port) || port <= 0) {
    return std::nullopt;
  }
  return port;
}

// Whether `binary --helpfull` lists `--<flag>` (absl prints each flag as "    --name (...").
bool BinaryHasFlag(const std::string& binary, absl::string_view flag) {
  absl::StatusOr<std::unique_ptr<Subprocess>> child =
      Subprocess::Spawn({binary, "--helpfull"}, {.pipe_stdout = true});
  if (!child.ok()) return false;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  const std::string wanted = absl::StrCat("--", flag, " ");
  bool found = false;
  for (absl::StatusOr<std::string> line = (*child)->ReadLine(deadline); line.ok();
       line = (*child)->ReadLine(deadline)) {
    if (absl::StartsWith(absl::StripLeadingAsciiWhitespace(*line), wanted)) found = true;
  }
  (void)(*child)->Wait(deadline);
  return found;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ServerSupervisor>> ServerSupervisor::Start(
    ServerSupervisorOptions options) {
  if (options.binary.empty() || access(options.binary.c_str(), X_OK) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--spawn-server: '", options.binary, "' is not an executable file"));
  }
  if (options.work_dir.empty() || access(options.work_dir.c_str(), W_OK) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("server work dir '", options.work_dir, "' is not a writable directory"));
  }
  std::unique_ptr<ServerSupervisor> s(new ServerSupervisor(std::move(options)));
  s->port_file_ = absl::StrCat(s->options_.work_dir, "/server.port");
  s->persistent_ =
      !s->options_.data_dir.empty() && BinaryHasFlag(s->options_.binary, "data_dir");
  s->metrics_off_ = BinaryHasFlag(s->options_.binary, "metrics_listen");
  if (absl::Status st = s->SpawnAndWait("127.0.0.1:0"); !st.ok()) return st;
  return s;
}

std::string ServerSupervisor::address() const { return absl::StrCat("127.0.0.1:", port_); }

absl::Status ServerSupervisor::SpawnAndWait(const std::string& listen) {
  std::remove(port_file_.c_str());
  std::vector<std::string> argv = {options_.binary, absl::StrCat("--listen=", listen),
                                   absl::StrCat("--port_file=", port_file_)};
  if (persistent_) argv.push_back(absl::StrCat("--data_dir=", options_.data_dir));
  // The default metrics port is fixed (9464): a server already running on this machine holds it
  // and this one would exit "cannot serve". An --server-arg=--metrics_listen=... comes later and
  // wins.
  if (metrics_off_) argv.push_back("--metrics_listen=");
  if (!options_.policy_file.empty()) {
    argv.push_back(absl::StrCat("--policy=", options_.policy_file));
  }
  argv.insert(argv.end(), options_.extra_args.begin(), options_.extra_args.end());
  absl::StatusOr<std::unique_ptr<Subprocess>> child = Subprocess::Spawn(argv);
  if (!child.ok()) return child.status();
  const absl::Time deadline = absl::Now() + options_.start_timeout;
  while (true) {
    if (std::optional<int> port = ReadPortFile(port_file_); port.has_value()) {
      port_ = *port;
      child_ = *std::move(child);
      return absl::OkStatus();
    }
    if (std::optional<int> exited = (*child)->Poll(); exited.has_value()) {
      return absl::UnavailableError(absl::StrCat("retry-budget-server on ", listen,
                                                 " exited before serving: ",
                                                 DescribeWaitStatus(*exited)));
    }
    if (absl::Now() >= deadline) {
      return absl::UnavailableError(absl::StrCat("retry-budget-server on ", listen,
                                                 " wrote no port file within ",
                                                 absl::FormatDuration(options_.start_timeout)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

absl::Status ServerSupervisor::Kill() {
  if (child_ == nullptr) return absl::FailedPreconditionError("no server running to kill");
  child_->Signal(SIGKILL);
  absl::StatusOr<int> status = child_->Wait(absl::Now() + absl::Seconds(10));
  if (!status.ok()) return status.status();
  child_.reset();
  return absl::OkStatus();
}

absl::Status ServerSupervisor::Restart() {
  if (child_ != nullptr) return absl::FailedPreconditionError("the server is still running");
  const absl::Time deadline = absl::Now() + options_.start_timeout;
  const std::string listen = address();
  while (true) {
    absl::Status st = SpawnAndWait(listen);
    if (st.ok()) return st;
    // "cannot serve" is the port still held by the killed server's socket: try again.
    const bool retry = absl::StrContains(st.message(),
                                         absl::StrCat("exit code ", kServerExitCannotServe));
    if (!retry || absl::Now() >= deadline) return st;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void ServerSupervisor::Stop() {
  if (child_ != nullptr) child_->Signal(SIGSTOP);
}

void ServerSupervisor::Resume() {
  if (child_ != nullptr) child_->Signal(SIGCONT);
}

absl::Status ServerSupervisor::Shutdown(absl::Duration grace) {
  if (child_ == nullptr) return absl::OkStatus();
  child_->Signal(SIGCONT);
  child_->Signal(SIGTERM);
  absl::StatusOr<int> status = child_->Wait(absl::Now() + grace);
  if (!status.ok()) {
    child_.reset();  // SIGKILL and reap
    return absl::DeadlineExceededError(absl::StrCat(
        "retry-budget-server did not exit within ", absl::FormatDuration(grace),
        " of SIGTERM (killed)"));
  }
  child_.reset();
  if (!ExitedWith(*status, 0)) {
    return absl::InternalError(
        absl::StrCat("retry-budget-server: ", DescribeWaitStatus(*status), " after SIGTERM"));
  }
  return absl::OkStatus();
}

}  // namespace retrybudget::fleet
