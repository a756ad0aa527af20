// The shared child-process library against real programs (/bin/sh, /bin/cat, /bin/true). The
// deadlines are generous upper bounds for a loaded machine: nothing here asserts how fast a
// process starts or ends, only what happens.
#include "common/subprocess.h"

#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace retrybudget {
namespace {

using ::testing::HasSubstr;

// Far more than any child here needs, even on a busy machine.
absl::Time GenerousDeadline() { return absl::Now() + absl::Seconds(30); }
constexpr absl::Duration kGenerousGrace = absl::Seconds(30);
// For deadlines that are meant to expire.
absl::Time ShortDeadline() { return absl::Now() + absl::Milliseconds(100); }

// True when `pid` is no child of this process any more: neither running nor a zombie.
bool NoLongerOurChild(pid_t pid) { return waitpid(pid, nullptr, WNOHANG) == -1 && errno == ECHILD; }

int OpenDescriptorCount() {
  int n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    ++n;
  }
  return n;
}

bool KilledBy(int wait_status, int signal) {
  return WIFSIGNALED(wait_status) && WTERMSIG(wait_status) == signal;
}

TEST(SubprocessTest, ReadsStdoutLineByLineThenEndOfFile) {
  auto child =
      Subprocess::Spawn({"/bin/sh", "-c", "echo first; printf last"}, {.pipe_stdout = true});
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_EQ((*child)->ReadLine(GenerousDeadline()).value_or("error"), "first");
  EXPECT_EQ((*child)->ReadLine(GenerousDeadline()).value_or("error"), "last");  // no '\n'
  EXPECT_TRUE(absl::IsOutOfRange((*child)->ReadLine(GenerousDeadline()).status()));
  absl::StatusOr<int> status = (*child)->Wait(GenerousDeadline());
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(ExitedWith(*status, 0)) << DescribeWaitStatus(*status);
}

TEST(SubprocessTest, WritesStdinAndReadsTheEcho) {
  auto cat = Subprocess::Spawn({"/bin/cat"}, {.pipe_stdin = true, .pipe_stdout = true});
  ASSERT_TRUE(cat.ok()) << cat.status();
  ASSERT_TRUE((*cat)->WriteStdin("hello\n").ok());
  EXPECT_EQ((*cat)->ReadLine(GenerousDeadline()).value_or("error"), "hello");
  (*cat)->CloseStdin();
  EXPECT_TRUE(absl::IsOutOfRange((*cat)->ReadLine(GenerousDeadline()).status()));
  EXPECT_TRUE(absl::IsFailedPrecondition((*cat)->WriteStdin("late\n")));
  absl::StatusOr<int> status = (*cat)->Wait(GenerousDeadline());
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(ExitedWith(*status, 0)) << DescribeWaitStatus(*status);
}

TEST(SubprocessTest, ReadLineGivesDeadlineExceededWhenNoLineComesAndLosesNothing) {
  // cat with its stdin held open writes nothing and never ends.
  auto cat = Subprocess::Spawn({"/bin/cat"}, {.pipe_stdin = true, .pipe_stdout = true});
  ASSERT_TRUE(cat.ok()) << cat.status();
  absl::StatusOr<std::string> none = (*cat)->ReadLine(ShortDeadline());
  EXPECT_TRUE(absl::IsDeadlineExceeded(none.status())) << none.status();
  EXPECT_THAT(none.status().message(), HasSubstr("/bin/cat"));
  EXPECT_TRUE(absl::IsDeadlineExceeded((*cat)->ReadLine(absl::InfinitePast()).status()));

  // Half a line when the deadline passes stays buffered for the next call.
  ASSERT_TRUE((*cat)->WriteStdin("par").ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded((*cat)->ReadLine(ShortDeadline()).status()));
  ASSERT_TRUE((*cat)->WriteStdin("tial\n").ok());
  EXPECT_EQ((*cat)->ReadLine(GenerousDeadline()).value_or("error"), "partial");
  EXPECT_FALSE((*cat)->Poll().has_value());
}

TEST(SubprocessTest, ReadLineWithoutAStdoutPipeIsFailedPrecondition) {
  auto cat = Subprocess::Spawn({"/bin/cat"}, {.pipe_stdin = true});
  ASSERT_TRUE(cat.ok()) << cat.status();
  EXPECT_TRUE(absl::IsFailedPrecondition((*cat)->ReadLine(GenerousDeadline()).status()));
}

TEST(SubprocessTest, WaitPastItsDeadlineLeavesTheChildRunning) {
  auto cat = Subprocess::Spawn({"/bin/cat"}, {.pipe_stdin = true});
  ASSERT_TRUE(cat.ok()) << cat.status();
  absl::StatusOr<int> early = (*cat)->Wait(ShortDeadline());
  EXPECT_TRUE(absl::IsDeadlineExceeded(early.status())) << early.status();
  EXPECT_THAT(early.status().message(), HasSubstr("/bin/cat"));
  EXPECT_FALSE((*cat)->Poll().has_value());
  (*cat)->CloseStdin();  // cat ends at end of file
  absl::StatusOr<int> status = (*cat)->Wait(GenerousDeadline());
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(ExitedWith(*status, 0)) << DescribeWaitStatus(*status);
  EXPECT_EQ((*cat)->Poll(), *status);
}

TEST(SubprocessTest, StopReturnsTheStatusOfAChildThatHeedsTheSignal) {
  auto cat = Subprocess::Spawn({"/bin/cat"}, {.pipe_stdin = true});
  ASSERT_TRUE(cat.ok()) << cat.status();
  const pid_t pid = (*cat)->pid();
  absl::StatusOr<int> status = (*cat)->Stop(SIGTERM, kGenerousGrace);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(KilledBy(*status, SIGTERM)) << DescribeWaitStatus(*status);
  EXPECT_TRUE(NoLongerOurChild(pid));
  // Stopping again reports the same status and signals nothing.
  EXPECT_EQ((*cat)->Stop(SIGTERM, kGenerousGrace).value_or(-1), *status);
}

TEST(SubprocessTest, StopFallsBackToSigkillWhenSigtermIsIgnored) {
  // The shell ignores SIGTERM, says so, and becomes a cat that inherits the ignoring.
  auto child = Subprocess::Spawn({"/bin/sh", "-c", "trap '' TERM; echo ready; exec /bin/cat"},
                                 {.pipe_stdin = true, .pipe_stdout = true});
  ASSERT_TRUE(child.ok()) << child.status();
  ASSERT_EQ((*child)->ReadLine(GenerousDeadline()).value_or("error"), "ready");
  const pid_t pid = (*child)->pid();
  absl::StatusOr<int> status = (*child)->Stop(SIGTERM, absl::Milliseconds(200));
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(KilledBy(*status, SIGKILL)) << DescribeWaitStatus(*status);
  EXPECT_TRUE(NoLongerOurChild(pid));
}

TEST(SubprocessTest, StopResumesAStoppedChildSoItCanActOnTheSignal) {
  auto cat = Subprocess::Spawn({"/bin/cat"}, {.pipe_stdin = true});
  ASSERT_TRUE(cat.ok()) << cat.status();
  (*cat)->Signal(SIGSTOP);
  // Without the SIGCONT the SIGTERM would wait for the grace to run out, then SIGKILL.
  absl::StatusOr<int> status = (*cat)->Stop(SIGTERM, kGenerousGrace);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(KilledBy(*status, SIGTERM)) << DescribeWaitStatus(*status);
}

TEST(SubprocessTest, ChildStartsWithDefaultSignalsWhateverTheParentIgnoresOrBlocks) {
  // Ignored here (as in a background job): the child still dies of it.
  struct sigaction ignore = {};
  struct sigaction old_term = {};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(sigaction(SIGTERM, &ignore, &old_term), 0);
  auto term = Subprocess::Spawn({"/bin/cat"}, {.pipe_stdin = true});
  sigaction(SIGTERM, &old_term, nullptr);
  // Blocked in this thread (as in a sigwait() thread): the child has it unblocked.
  sigset_t sigint, old_mask;
  sigemptyset(&sigint);
  sigaddset(&sigint, SIGINT);
  ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &sigint, &old_mask), 0);
  auto interrupt = Subprocess::Spawn({"/bin/cat"}, {.pipe_stdin = true});
  pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  ASSERT_TRUE(term.ok()) << term.status();
  ASSERT_TRUE(interrupt.ok()) << interrupt.status();

  absl::StatusOr<int> term_status = (*term)->Stop(SIGTERM, kGenerousGrace);
  ASSERT_TRUE(term_status.ok()) << term_status.status();
  EXPECT_TRUE(KilledBy(*term_status, SIGTERM)) << DescribeWaitStatus(*term_status);
  absl::StatusOr<int> int_status = (*interrupt)->Stop(SIGINT, kGenerousGrace);
  ASSERT_TRUE(int_status.ok()) << int_status.status();
  EXPECT_TRUE(KilledBy(*int_status, SIGINT)) << DescribeWaitStatus(*int_status);
}

TEST(SubprocessTest, MissingProgramIsNotFoundNamingIt) {
  const std::string missing = "/nonexistent/retry-budget-no-such-program";
  auto child = Subprocess::Spawn({missing, "--flag"}, {.pipe_stdout = true});
  ASSERT_FALSE(child.ok());
  EXPECT_TRUE(absl::IsNotFound(child.status())) << child.status();
  EXPECT_THAT(child.status().message(), HasSubstr(missing));
}

TEST(SubprocessTest, ProgramThatIsNotExecutableIsPermissionDeniedNamingIt) {
  const std::string path = ::testing::TempDir() + "/subprocess_test_not_executable";
  std::ofstream(path) << "#!/bin/sh\n";
  std::filesystem::permissions(
      path, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  auto child = Subprocess::Spawn({path});
  std::filesystem::remove(path);
  ASSERT_FALSE(child.ok());
  EXPECT_TRUE(absl::IsPermissionDenied(child.status())) << child.status();
  EXPECT_THAT(child.status().message(), HasSubstr(path));
}

TEST(SubprocessTest, EmptyArgvAndConflictingOptionsAreInvalidArguments) {
  EXPECT_TRUE(absl::IsInvalidArgument(Subprocess::Spawn({}).status()));
  auto both = Subprocess::Spawn({"/bin/true"}, {.pipe_stdout = true, .output_file = "/dev/null"});
  EXPECT_TRUE(absl::IsInvalidArgument(both.status())) << both.status();
  EXPECT_THAT(both.status().message(), HasSubstr("/bin/true"));
}

TEST(SubprocessTest, UnwritableOutputFileIsAnErrorNamingProgramAndFile) {
  const std::string file = "/nonexistent/dir/output";
  auto child = Subprocess::Spawn({"/bin/true"}, {.output_file = file});
  ASSERT_FALSE(child.ok());
  EXPECT_THAT(child.status().message(), HasSubstr("/bin/true"));
  EXPECT_THAT(child.status().message(), HasSubstr(file));
}

TEST(SubprocessTest, OutputFileGetsStdoutAndStderr) {
  const std::string path = ::testing::TempDir() + "/subprocess_test_output";
  std::ofstream(path) << "left over from before\n";
  auto child = Subprocess::Spawn({"/bin/sh", "-c", "echo to-stdout; echo to-stderr >&2"},
                                 {.output_file = path});
  ASSERT_TRUE(child.ok()) << child.status();
  absl::StatusOr<int> status = (*child)->Wait(GenerousDeadline());
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(ExitedWith(*status, 0)) << DescribeWaitStatus(*status);
  std::ifstream in(path);
  const std::string output((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(output, "to-stdout\nto-stderr\n");
  std::filesystem::remove(path);
}

TEST(SubprocessTest, DestroyingARunningChildKillsAndReapsIt) {
  auto cat = Subprocess::Spawn({"/bin/cat"}, {.pipe_stdin = true, .pipe_stdout = true});
  ASSERT_TRUE(cat.ok()) << cat.status();
  const pid_t pid = (*cat)->pid();
  ASSERT_FALSE(NoLongerOurChild(pid));
  cat->reset();
  EXPECT_TRUE(NoLongerOurChild(pid));
}

TEST(SubprocessTest, LeavesNoDescriptorsOpen) {
  const int before = OpenDescriptorCount();
  {
    auto cat = Subprocess::Spawn({"/bin/cat"}, {.pipe_stdin = true, .pipe_stdout = true});
    ASSERT_TRUE(cat.ok()) << cat.status();
    auto to_file = Subprocess::Spawn({"/bin/true"}, {.output_file = "/dev/null"});
    ASSERT_TRUE(to_file.ok()) << to_file.status();
    EXPECT_TRUE((*to_file)->Wait(GenerousDeadline()).ok());
    EXPECT_TRUE(absl::IsNotFound(
        Subprocess::Spawn({"/nonexistent/program"}, {.pipe_stdin = true, .pipe_stdout = true})
            .status()));
  }
  EXPECT_EQ(OpenDescriptorCount(), before);
}

TEST(SubprocessTest, ChildrenDoNotInheritEachOthersPipes) {
  auto first = Subprocess::Spawn({"/bin/cat"}, {.pipe_stdin = true, .pipe_stdout = true});
  ASSERT_TRUE(first.ok()) << first.status();
  // Still running while `first` ends: had it inherited either end of `first`'s pipes, `first`
  // would see no end of file on its stdin, or we none on its stdout.
  auto second = Subprocess::Spawn({"/bin/cat"}, {.pipe_stdin = true, .pipe_stdout = true});
  ASSERT_TRUE(second.ok()) << second.status();
  (*first)->CloseStdin();
  absl::StatusOr<std::string> eof = (*first)->ReadLine(GenerousDeadline());
  EXPECT_TRUE(absl::IsOutOfRange(eof.status())) << eof.status();
  EXPECT_FALSE((*second)->Poll().has_value());
}

TEST(SubprocessTest, WritingToAChildThatClosedItsStdinIsUnavailableNotSigpipe) {
  auto child = Subprocess::Spawn({"/bin/true"}, {.pipe_stdin = true});
  ASSERT_TRUE(child.ok()) << child.status();
  ASSERT_TRUE((*child)->Wait(GenerousDeadline()).ok());
  const absl::Status write = (*child)->WriteStdin("anyone there?\n");
  EXPECT_TRUE(absl::IsUnavailable(write)) << write;
  EXPECT_THAT(write.message(), HasSubstr("/bin/true"));
  // This process is alive; no SIGPIPE is left pending, and its disposition is untouched.
  sigset_t pending;
  sigpending(&pending);
  EXPECT_EQ(sigismember(&pending, SIGPIPE), 0);
  struct sigaction action = {};
  sigaction(SIGPIPE, nullptr, &action);
  EXPECT_EQ(action.sa_handler, SIG_DFL);
}

TEST(SubprocessTest, SignalAfterReapingIsHarmless) {
  auto child = Subprocess::Spawn({"/bin/true"});
  ASSERT_TRUE(child.ok()) << child.status();
  absl::StatusOr<int> status = (*child)->Wait(GenerousDeadline());
  ASSERT_TRUE(status.ok()) << status.status();
  (*child)->Signal(SIGKILL);  // the pid may belong to another process by now: not sent
  EXPECT_EQ((*child)->Poll(), *status);
}

TEST(SubprocessTest, DescribesWaitStatuses) {
  auto exits = Subprocess::Spawn({"/bin/sh", "-c", "exit 3"});
  ASSERT_TRUE(exits.ok()) << exits.status();
  absl::StatusOr<int> status = (*exits)->Wait(GenerousDeadline());
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(ExitedWith(*status, 3));
  EXPECT_FALSE(ExitedWith(*status, 0));
  EXPECT_EQ(DescribeWaitStatus(*status), "exit code 3");

  auto killed = Subprocess::Spawn({"/bin/cat"}, {.pipe_stdin = true});
  ASSERT_TRUE(killed.ok()) << killed.status();
  absl::StatusOr<int> kill_status = (*killed)->Stop(SIGKILL, kGenerousGrace);
  ASSERT_TRUE(kill_status.ok()) << kill_status.status();
  EXPECT_FALSE(ExitedWith(*kill_status, 0));
  EXPECT_THAT(DescribeWaitStatus(*kill_status), HasSubstr("killed by signal 9"));
}

}  // namespace
}  // namespace retrybudget
