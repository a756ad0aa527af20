#include "tests/integration/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace retrybudget::testing {
namespace {

// Process start-up is real time, not budget time: polling here is waiting for the OS.
constexpr absl::Duration kPoll = absl::Milliseconds(10);

std::optional<int> DecodeWaitStatus(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return -WTERMSIG(status);
  return std::nullopt;
}

}  // namespace

std::optional<ChildProcess> ChildProcess::Start(const std::string& binary,
                                                const std::vector<std::string>& args,
                                                const std::string& output_path) {
  std::vector<std::string> argv_storage = {binary};
  argv_storage.insert(argv_storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);

  const int out = open(output_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out < 0) {
    ADD_FAILURE() << "cannot create " << output_path;
    return std::nullopt;
  }
  const pid_t pid = fork();
  if (pid < 0) {
    close(out);
    ADD_FAILURE() << "fork failed";
    return std::nullopt;
  }
  if (pid == 0) {
    // Child: only async-signal-safe calls until exec.
    dup2(out, STDOUT_FILENO);
    dup2(out, STDERR_FILENO);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(out);
  return ChildProcess(pid, output_path);
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept
    : pid_(other.pid_), output_path_(std::move(other.output_path_)),
      exit_code_(other.exit_code_) {
  other.pid_ = -1;
}

ChildProcess& ChildProcess::operator=(ChildProcess&& other) noexcept {
  if (this != &other) {
    KillAndReap();
    pid_ = other.pid_;
    output_path_ = std::move(other.output_path_);
    exit_code_ = other.exit_code_;
    other.pid_ = -1;
  }
  return *this;
}

ChildProcess::~ChildProcess() { KillAndReap(); }

void ChildProcess::KillAndReap() {
  if (pid_ > 0 && !exit_code_.has_value()) {
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
    exit_code_ = DecodeWaitStatus(status);
  }
}

void ChildProcess::Signal(int signo) {
  if (pid_ > 0 && !exit_code_.has_value()) kill(pid_, signo);
}

bool ChildProcess::Running() {
  if (pid_ <= 0 || exit_code_.has_value()) return false;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == pid_) {
    exit_code_ = DecodeWaitStatus(status);
    return false;
  }
  return true;
}

std::optional<int> ChildProcess::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (Running()) {
    if (absl::Now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(absl::ToChronoNanoseconds(kPoll));
  }
  return exit_code_;
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
