#include "tools/fleet/mode_switcher.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "retrybudget/clock.h"
#include "tools/fleet/subprocess.h"

namespace retrybudget::fleet {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

ModeSwitcher::ModeSwitcher(ModeSwitcherOptions options, std::chrono::steady_clock::time_point t0)
    : options_(std::move(options)), t0_(t0) {
  thread_ = std::jthread([this](std::stop_token stop) { Run(stop); });
}

ModeSwitcher::~ModeSwitcher() { Finish(); }

std::vector<FleetRun::ModeSwitch> ModeSwitcher::Finish() {
  if (thread_.joinable()) {
    thread_.request_stop();
    thread_.join();
  }
  return done_;
}

void ModeSwitcher::Run(std::stop_token stop) {
  const absl::Time origin = absl::Now() - absl::Seconds(SecondsSince(t0_));
  for (const ModeSwitchStep& step : options_.plan) {
    Clock::Real()->SleepUntil(origin + absl::Seconds(step.at_seconds), stop);
    if (stop.stop_requested()) return;
    done_.push_back(SwitchAll(step));
  }
}

// budgetctl for each tenant in turn; the switch is done when the last one returned.
FleetRun::ModeSwitch ModeSwitcher::SwitchAll(const ModeSwitchStep& step) const {
  FleetRun::ModeSwitch s{.started_at = SecondsSince(t0_), .mode = step.mode, .result = "OK"};
  for (const std::string& tenant : options_.tenants) {
    absl::StatusOr<std::unique_ptr<Subprocess>> child = Subprocess::Spawn(
        {options_.budgetctl, absl::StrCat("--server=", options_.server), "mode", tenant,
         step.mode},
        {.output_file = "/dev/null"});
    if (!child.ok()) {
      s.result = child.status().ToString();
      break;
    }
    absl::StatusOr<int> status = (*child)->Wait(absl::Now() + options_.timeout);
    if (!status.ok() || !ExitedWith(*status, 0)) {
      s.result = absl::StrCat(
          "budgetctl mode ", tenant, " ", step.mode, ": ",
          status.ok() ? DescribeWaitStatus(*status) : status.status().ToString());
      break;
    }
  }
  s.done_at = SecondsSince(t0_);
  return s;
}

}  // namespace retrybudget::fleet
