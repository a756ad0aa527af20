// The fleet's names for the shared child-process library (common/subprocess.h): the tool's
// workers, the server it supervises, and the server and tool in the fleet tests.
//
//   auto child = Subprocess::Spawn({"/usr/bin/true"}, {.pipe_stdout = true});
//   if (!child.ok()) return child.status();
//   absl::StatusOr<std::string> line = (*child)->ReadLine(absl::Now() + absl::Seconds(5));
//   absl::StatusOr<int> status = (*child)->Wait(absl::Now() + absl::Seconds(5));
#ifndef RETRYBUDGET_TOOLS_FLEET_SUBPROCESS_H_
#define RETRYBUDGET_TOOLS_FLEET_SUBPROCESS_H_

#include "common/subprocess.h"

namespace retrybudget::fleet {

using ::retrybudget::DescribeWaitStatus;
using ::retrybudget::ExitedWith;
using ::retrybudget::Subprocess;
using ::retrybudget::SubprocessOptions;

}  // namespace retrybudget::fleet

#endif  // RETRYBUDGET_TOOLS_FLEET_SUBPROCESS_H_
