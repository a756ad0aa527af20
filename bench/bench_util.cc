#include "bench/bench_util.h"

#include <arpa/inet.h>
#include <malloc.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace retrybudget::bench {

double Percentile(std::vector<double>& values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = std::ceil(p / 100.0 * static_cast<double>(values.size()));
  const size_t index = static_cast<size_t>(std::clamp(rank, 1.0, double(values.size()))) - 1;
  return values[index];
}

double Median(std::vector<double> values, double if_empty) {
  if (values.empty()) return if_empty;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

namespace {
sockaddr_in Loopback(int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return addr;
}
}  // namespace

absl::StatusOr<int> PickFreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in addr = Loopback(0);
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const std::string error = std::strerror(errno);
    close(fd);
    return absl::UnavailableError(absl::StrCat("bind 127.0.0.1:0: ", error));
  }
  close(fd);
  return ntohs(addr.sin_port);
}

bool WaitForTcpPort(int port, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr = Loopback(port);
    const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    close(fd);
    if (ok) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

absl::StatusOr<Child> Child::Spawn(const std::vector<std::string>& argv) {
  absl::StatusOr<std::unique_ptr<Subprocess>> process =
      Subprocess::Spawn(argv, {.pipe_stdin = true, .pipe_stdout = true});
  if (!process.ok()) return process.status();
  return Child(*std::move(process));
}

absl::StatusOr<std::string> Child::ReadLine(absl::Duration timeout) {
  if (process_ == nullptr) return absl::FailedPreconditionError("Child::ReadLine after a move");
  return process_->ReadLine(absl::Now() + timeout);
}

absl::Status Child::WriteLine(const std::string& line) {
  if (process_ == nullptr) return absl::FailedPreconditionError("Child::WriteLine after a move");
  return process_->WriteStdin(absl::StrCat(line, "\n"));
}

int Child::Stop(int signo, absl::Duration timeout) {
  if (process_ == nullptr) return 0;
  // An error means the status was taken elsewhere: the child is gone either way.
  return process_->Stop(signo, timeout).value_or(0);
}

std::optional<std::string> Child::Exited() {
  if (process_ == nullptr) return std::nullopt;
  const std::optional<int> status = process_->Poll();
  if (!status.has_value()) return std::nullopt;
  return DescribeWaitStatus(*status);
}

int64_t RssBytes(pid_t pid) {
  std::ifstream in(pid == 0 ? std::string("/proc/self/statm")
                            : absl::StrCat("/proc/", pid, "/statm"));
  int64_t size = 0, resident = 0;
  if (!(in >> size >> resident)) return -1;
  return resident * sysconf(_SC_PAGESIZE);
}

double ProcessCpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Fields after the command name (which may hold spaces) start after the last ')'.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  std::vector<std::string> fields;
  size_t pos = close + 2;
  while (pos < stat.size()) {
    const size_t space = stat.find(' ', pos);
    fields.push_back(stat.substr(pos, space - pos));
    if (space == std::string::npos) break;
    pos = space + 1;
  }
  // fields[0] is field 3 (state); utime is field 14, stime field 15.
  if (fields.size() < 13) return -1;
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  return (std::stod(fields[11]) + std::stod(fields[12])) / ticks;
}

int64_t MallocInUseBytes() {
  const struct mallinfo2 mi = mallinfo2();
  return static_cast<int64_t>(mi.uordblks + mi.hblkhd);
}

std::string JsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

std::string SelfExe() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string("/proc/self/exe");
}

absl::StatusOr<std::unique_ptr<testing::ServerUnderTest>> StartBudgetServer(
    const std::string& server_bin, const std::string& dir, const std::string& policy,
    const std::vector<std::string>& extra_args) {
  std::vector<std::string> flags;
  if (!policy.empty()) {
    const std::string policy_file = dir + "/policy.txtpb";
    std::ofstream(policy_file) << policy;
    flags.push_back(absl::StrCat("--policy=", policy_file));
  }
  flags.insert(flags.end(), extra_args.begin(), extra_args.end());
  return testing::ServerUnderTest::Start(
      {.binary = server_bin, .flags = std::move(flags), .dir = dir});
}

}  // namespace retrybudget::bench
