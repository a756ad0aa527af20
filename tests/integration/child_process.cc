#include "tests/integration/child_process.h"

#include <stdlib.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace retrybudget::testing {
namespace {

// Process start-up is real time, not budget time: polling here is waiting for the OS.
constexpr absl::Duration kPoll = absl::Milliseconds(10);

}  // namespace

std::optional<ChildProcess> ChildProcess::Start(const std::string& binary,
                                                const std::vector<std::string>& args,
                                                const std::string& output_path) {
  std::vector<std::string> argv = {binary};
  argv.insert(argv.end(), args.begin(), args.end());
  absl::StatusOr<std::unique_ptr<Subprocess>> process =
      Subprocess::Spawn(std::move(argv), {.output_file = output_path});
  if (!process.ok()) {
    ADD_FAILURE() << process.status();
    return std::nullopt;
  }
  return ChildProcess(*std::move(process), output_path);
}

void ChildProcess::Signal(int signo) {
  if (process_ != nullptr) process_->Signal(signo);
}

bool ChildProcess::Running() { return process_ != nullptr && !process_->Poll().has_value(); }

std::optional<int> ChildProcess::Wait(absl::Duration timeout) {
  if (process_ == nullptr) return std::nullopt;
  const absl::StatusOr<int> status = process_->Wait(absl::Now() + timeout);
  if (!status.ok()) return std::nullopt;
  if (WIFEXITED(*status)) return WEXITSTATUS(*status);
  if (WIFSIGNALED(*status)) return -WTERMSIG(*status);
  return std::nullopt;
}

std::string ChildProcess::Output() const {
  std::ifstream in(output_path_);
  std::stringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

ScopedTempDir::ScopedTempDir()
    : path_(absl::StrCat(::testing::TempDir(), "/retry-budget-test-XXXXXX")) {
  if (mkdtemp(path_.data()) == nullptr) ADD_FAILURE() << "mkdtemp " << path_;
}

ScopedTempDir::~ScopedTempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

std::optional<int> WaitForPortFile(const std::string& path, ChildProcess& child,
                                   absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline && child.Running()) {
    std::ifstream in(path);
    std::string line;
    int port = 0;
    if (in && std::getline(in, line) && absl::SimpleAtoi(line, &port) && port > 0) return port;
    std::this_thread::sleep_for(absl::ToChronoNanoseconds(kPoll));
  }
  return std::nullopt;
}

}  // namespace retrybudget::testing
