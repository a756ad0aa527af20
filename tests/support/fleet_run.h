// One run of the fleet tool (retry-budget-fleet) in a gtest test: the tool as a child process,
// its exit and its one JSON line (the report), parsed. Failures to start it, to see it exit
// within the deadline, or to parse its line are recorded as gtest failures (EXPECT), and the
// result holds whatever was read. Header-only, for tests (gtest, protobuf and
// retrybudget::subprocess linked by the test): no library of tests/support links gtest, since the
// fleet tool links that folder's launcher.
//
//   FleetRun r = RunFleetTool(RETRYBUDGET_FLEET_BIN, {"--server=127.0.0.1:50051", "--duration=4"});
//   ASSERT_TRUE(r.Has("within_budget")) << "no JSON report: " << r.line;
//   EXPECT_TRUE(r.Bool("within_budget")) << r.line;
#ifndef RETRYBUDGET_TESTS_SUPPORT_FLEET_RUN_H_
#define RETRYBUDGET_TESTS_SUPPORT_FLEET_RUN_H_

#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/subprocess.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"

namespace retrybudget::testing {

struct FleetRun {
  int wait_status = -1;  // the raw wait status; -1 when the tool was not seen to exit
  std::string line;      // the report as printed; empty when none was
  google::protobuf::Struct json;

  // The report's fields; At() and the typed readers throw std::out_of_range for a missing key.
  bool Has(const std::string& key) const { return json.fields().contains(key); }
  const google::protobuf::Value& At(const std::string& key) const { return json.fields().at(key); }
  double Num(const std::string& key) const { return At(key).number_value(); }
  bool Bool(const std::string& key) const { return At(key).bool_value(); }
  // The fields of the object `object`.
  bool SubHas(const std::string& object, const std::string& key) const {
    return Has(object) && At(object).struct_value().fields().contains(key);
  }
  double Sub(const std::string& object, const std::string& key) const {
    return At(object).struct_value().fields().at(key).number_value();
  }
  bool SubBool(const std::string& object, const std::string& key) const {
    return At(object).struct_value().fields().at(key).bool_value();
  }
  std::string SubString(const std::string& object, const std::string& key) const {
    return At(object).struct_value().fields().at(key).string_value();
  }
};

// Runs `fleet_binary args...`, reads its first stdout line and waits for its exit, both within
// `timeout`. The line is also printed to stderr ("[fleet] ...") for the test's log.
inline FleetRun RunFleetTool(const std::string& fleet_binary, const std::vector<std::string>& args,
                             absl::Duration timeout = absl::Seconds(90)) {
  std::vector<std::string> argv = {fleet_binary};
  argv.insert(argv.end(), args.begin(), args.end());
  FleetRun result;
  absl::StatusOr<std::unique_ptr<Subprocess>> child =
      Subprocess::Spawn(argv, {.pipe_stdout = true});
  EXPECT_TRUE(child.ok()) << child.status();
  if (!child.ok()) return result;
  const absl::Time deadline = absl::Now() + timeout;
  absl::StatusOr<std::string> line = (*child)->ReadLine(deadline);
  absl::StatusOr<int> status = (*child)->Wait(deadline);
  EXPECT_TRUE(status.ok()) << status.status();
  if (status.ok()) result.wait_status = *status;
  if (line.ok()) {
    result.line = *line;
    std::cerr << "[fleet] " << result.line << "\n";
    EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(result.line, &result.json).ok())
        << result.line;
  }
  return result;
}

}  // namespace retrybudget::testing

#endif  // RETRYBUDGET_TESTS_SUPPORT_FLEET_RUN_H_
