#include "tools/fleet/chaos_schedule.h"

#include <cmath>
#include <condition_variable>
#include <mutex>
#include <algorithm>
#include <vector>
#include <stop_token>

#include "absl/strings/str_cat.h"

namespace retrybudget::fleet {
namespace {

absl::Status CheckSeconds(const char* flag, const std::optional<double>& v) {
  if (v.has_value() && !(std::isfinite(*v) && *v >= 0 && *v <= 86400)) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": must be in [0, 86400] seconds, got ", *v));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateChaosPlan(const ChaosPlan& p) {
  for (auto [flag, v] : {std::pair<const char*, std::optional<double>>{"--kill-server-after",
                                                                       p.kill_after},
                         {"--restart-after", p.restart_after},
                         {"--stop-server-after", p.stop_after},
                         {"--resume-after", p.resume_after}}) {
    if (absl::Status s = CheckSeconds(flag, v); !s.ok()) return s;
  }
  if (p.restart_after.has_value() && !p.kill_after.has_value()) {
    return absl::InvalidArgumentError("--restart-after needs --kill-server-after");
  }
  if (p.resume_after.has_value() && !p.stop_after.has_value()) {
    return absl::InvalidArgumentError("--resume-after needs --stop-server-after");
  }
  if (p.kill_after.has_value() && p.stop_after.has_value()) {
    // One fault at a time: the hang must end before the kill or start after the restart.
    const double kill_end = *p.kill_after + p.restart_after.value_or(INFINITY);
    const double stop_end = *p.stop_after + p.resume_after.value_or(INFINITY);
    if (!(stop_end <= *p.kill_after || *p.stop_after >= kill_end)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--stop-server-after/--resume-after [", *p.stop_after, ", ", stop_end,
          "] overlaps --kill-server-after/--restart-after [", *p.kill_after, ", ", kill_end,
          "]: one fault at a time"));
    }
  }
  return absl::OkStatus();
}

ChaosSchedule::ChaosSchedule(ServerSupervisor& server, ChaosPlan plan,
                             std::chrono::steady_clock::time_point start)
    : server_(server), plan_(plan), start_(start) {
  view_.port = server.port();
  view_.persistent = server.persistent();
  thread_ = std::jthread([this](std::stop_token stop) { Play(stop); });
}

ChaosSchedule::~ChaosSchedule() { Finish(); }

double ChaosSchedule::Now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

bool ChaosSchedule::SleepUntil(double seconds, const std::stop_token& stop) const {
  std::mutex mu;
  std::condition_variable_any cv;
  std::unique_lock lock(mu);
  const auto at = start_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                               std::chrono::duration<double>(seconds));
  return !cv.wait_until(lock, stop, at, [] { return false; }) && !stop.stop_requested();
}

void ChaosSchedule::Play(std::stop_token stop) {
  struct Step {
    double at;
    int what;  // 0 kill, 1 stop
  };
  std::vector<Step> steps;
  if (plan_.kill_after) steps.push_back({*plan_.kill_after, 0});
  if (plan_.stop_after) steps.push_back({*plan_.stop_after, 1});
  std::sort(steps.begin(), steps.end(), [](const Step& a, const Step& b) { return a.at < b.at; });
  for (const Step& step : steps) {
    if (!SleepUntil(step.at, stop)) return;
    if (step.what == 0) {
      if (absl::Status s = server_.Kill(); !s.ok()) {
        view_.restart_error = absl::StrCat("kill: ", s.ToString());
        return;
      }
      view_.kill_at = Now();
      if (!plan_.restart_after) continue;
      // The restart happens even when the run ends first: the final Syncs need a server.
      SleepUntil(*view_.kill_at + *plan_.restart_after, stop);
      if (absl::Status s = server_.Restart(); !s.ok()) {
        view_.restart_error = s.ToString();
        return;
      }
      view_.restart_at = Now();
      view_.downtime_seconds = *view_.restart_at - *view_.kill_at;
    } else {
      server_.Stop();
      view_.stop_at = Now();
      const double resume_at = *view_.stop_at + plan_.resume_after.value_or(INFINITY);
      SleepUntil(resume_at, stop);
      server_.Resume();
      view_.resume_at = Now();
      view_.hung_seconds = *view_.resume_at - *view_.stop_at;
    }
  }
}

ChaosView ChaosSchedule::Finish() {
  if (thread_.joinable()) {
    thread_.request_stop();
    thread_.join();
  }
  return view_;
}

}  // namespace retrybudget::fleet
