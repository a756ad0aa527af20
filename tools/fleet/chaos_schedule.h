// The server faults of a chaos run, played on a thread of their own against a ServerSupervisor
// while the fleet runs: SIGKILL at `kill_after`, restart `restart_after` later (same port, same
// data directory); SIGSTOP at `stop_after`, SIGCONT `resume_after` later. It records when each
// happened, in seconds from the run's start.
//
//   ChaosSchedule chaos(*server, {.kill_after = 3, .restart_after = 3}, run_start);
//   ... the fleet runs ...
//   ChaosView view = chaos.Finish();  // waits for a restart in progress; the times of the faults
#ifndef RETRYBUDGET_TOOLS_FLEET_CHAOS_SCHEDULE_H_
#define RETRYBUDGET_TOOLS_FLEET_CHAOS_SCHEDULE_H_

#include <chrono>
#include <optional>
#include <thread>

#include "absl/status/status.h"
#include "tools/fleet/fleet_report.h"
#include "tools/fleet/server_supervisor.h"

namespace retrybudget::fleet {

struct ChaosPlan {
  std::optional<double> kill_after = {};     // seconds from the start
  std::optional<double> restart_after = {};  // seconds after the kill
  std::optional<double> stop_after = {};     // seconds from the start
  std::optional<double> resume_after = {};   // seconds after the stop
  bool any() const { return kill_after.has_value() || stop_after.has_value(); }
};

// INVALID_ARGUMENT naming the flag: negative or non-finite times, a restart without a kill, a
// resume without a stop, or a hang overlapping the downtime.
absl::Status ValidateChaosPlan(const ChaosPlan& plan);

// Not copyable. Finish() from the thread that created it; `server` must outlive the schedule and
// must not be used by anyone else until Finish() returned.
class ChaosSchedule {
 public:
  ChaosSchedule(ServerSupervisor& server, ChaosPlan plan,
                std::chrono::steady_clock::time_point start);
  ~ChaosSchedule();  // Finish()

  // Stops the events not yet due (a stopped server is resumed: it must serve the final Syncs),
  // joins the thread and returns the times. Idempotent.
  ChaosView Finish();

 private:
  void Play(std::stop_token stop);
  double Now() const;
  // Sleeps until `seconds` from the start; false when stopped first.
  bool SleepUntil(double seconds, const std::stop_token& stop) const;

  ServerSupervisor& server_;
  const ChaosPlan plan_;
  const std::chrono::steady_clock::time_point start_;
  ChaosView view_;  // written by thread_ until it is joined
  std::jthread thread_;
};

}  // namespace retrybudget::fleet

#endif  // RETRYBUDGET_TOOLS_FLEET_CHAOS_SCHEDULE_H_
