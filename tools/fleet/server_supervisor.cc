#include "tools/fleet/server_supervisor.h"

#include <signal.h>
#include <unistd.h>

#include <utility>

#include "absl/strings/str_cat.h"

namespace retrybudget::fleet {

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
  std::unique_ptr<ServerSupervisor> s(new ServerSupervisor());
  s->persistent_ = !options.data_dir.empty() && testing::BinaryHasFlag(options.binary, "data_dir");
  std::vector<std::string> flags;
  if (s->persistent_) flags.push_back(absl::StrCat("--data_dir=", options.data_dir));
  if (!options.policy_file.empty()) {
    flags.push_back(absl::StrCat("--policy=", options.policy_file));
  }
  // The extra arguments come last, so that an --server-arg=--metrics_listen=... wins over the
  // launcher's --metrics_listen= (metrics off: the default port may be held by another server).
  flags.insert(flags.end(), options.extra_args.begin(), options.extra_args.end());
  absl::StatusOr<std::unique_ptr<testing::ServerUnderTest>> server =
      testing::ServerUnderTest::Start({.binary = options.binary,
                                       .flags = std::move(flags),
                                       .dir = options.work_dir,
                                       .timeout = options.start_timeout});
  if (!server.ok()) return server.status();
  s->server_ = *std::move(server);
  return s;
}

std::string ServerSupervisor::address() const { return server_->address(); }

absl::Status ServerSupervisor::Kill() { return server_->Kill(); }

absl::Status ServerSupervisor::Restart() { return server_->Restart(); }

void ServerSupervisor::Stop() { (void)server_->Pause(); }

void ServerSupervisor::Resume() { (void)server_->Resume(); }

absl::Status ServerSupervisor::Shutdown(absl::Duration grace) {
  if (!server_->running()) return absl::OkStatus();
  absl::StatusOr<int> status = server_->Stop(SIGTERM, grace);
  if (!status.ok()) return status.status();
  if (WIFSIGNALED(*status) && WTERMSIG(*status) == SIGKILL) {
    return absl::DeadlineExceededError(absl::StrCat("retry-budget-server did not exit within ",
                                                    absl::FormatDuration(grace),
                                                    " of SIGTERM (killed)"));
  }
  if (!ExitedWith(*status, 0)) {
    return absl::InternalError(
        absl::StrCat("retry-budget-server: ", DescribeWaitStatus(*status), " after SIGTERM"));
  }
  return absl::OkStatus();
}

}  // namespace retrybudget::fleet
