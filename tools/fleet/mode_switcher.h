// --mode-switch: switches the run's tenants between enforce and shadow during the run with the
// real budgetctl binary (`budgetctl --server=<servers> mode <tenant> <mode>`), at times from the
// run's start, on its own thread, and records when each switch was started and done.
//
//   ModeSwitcher switcher({.budgetctl = path, .server = target, .tenants = names,
//                          .plan = {{2.0, "shadow"}, {5.0, "enforce"}}}, t0);
//   ...
//   std::vector<FleetRun::ModeSwitch> done = switcher.Finish();  // waits for the due ones
#ifndef RETRYBUDGET_TOOLS_FLEET_MODE_SWITCHER_H_
#define RETRYBUDGET_TOOLS_FLEET_MODE_SWITCHER_H_

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "tools/fleet/fleet_report.h"

namespace retrybudget::fleet {

struct ModeSwitchStep {
  double at_seconds = 0;
  std::string mode = {};  // "enforce" or "shadow"
};

struct ModeSwitcherOptions {
  std::string budgetctl = {};  // the binary (a path)
  std::string server = {};     // its --server
  std::vector<std::string> tenants = {};
  std::vector<ModeSwitchStep> plan = {};  // ascending at_seconds
  absl::Duration timeout = absl::Seconds(20);  // per budgetctl run
};

// Thread-compatible: one owner starts it and calls Finish() once.
class ModeSwitcher {
 public:
  ModeSwitcher(ModeSwitcherOptions options, std::chrono::steady_clock::time_point t0);
  ~ModeSwitcher();
  ModeSwitcher(const ModeSwitcher&) = delete;
  ModeSwitcher& operator=(const ModeSwitcher&) = delete;

  // Stops before the next switch not yet started (one in progress completes) and returns those
  // done, in order: started/done in seconds from t0, the mode, "OK" or budgetctl's failure.
  std::vector<FleetRun::ModeSwitch> Finish();

 private:
  void Run(std::stop_token stop);
  FleetRun::ModeSwitch SwitchAll(const ModeSwitchStep& step) const;

  const ModeSwitcherOptions options_;
  const std::chrono::steady_clock::time_point t0_;
  std::vector<FleetRun::ModeSwitch> done_;  // written by thread_ only until it is joined
  std::jthread thread_;
};

}  // namespace retrybudget::fleet

#endif  // RETRYBUDGET_TOOLS_FLEET_MODE_SWITCHER_H_
