// The C++ runner of the client conformance corpus (client/conformance/README.md): every
// scenario file of client/conformance/scenarios/ is one test. It drives the client a worker
// runs (BudgetClientImpl: its TenantRegistry, TenantBudgetImpl handles and Refresher::RunOnce /
// Shutdown) on a FakeClock, with every Sync answered by a scripted stub that checks the request
// against the scenario's next attempt.
//
// Attempt deadlines are wall-clock time (gRPC's). The runner reads the wall clock before the
// step (or when the previous attempt returned) and when the stub is called: the attempt's
// timeout lies between the two readings of the deadline, and the scenario's expect_timeout_ms
// must lie in that interval (within 0.001 ms). No check depends on how fast the code runs.
// wait_for_ready is read from the ClientContext (see InteropClientContextInspector below).
// A Refund() returns nothing in C++: a refund step's `expect` is not checked, except that
// "cost_out_of_range" must name a cost outside [1, TenantBudget::kMaxCost] (a try_acquire's
// "cost_out_of_range" is TryAcquire returning false: C++ denies such a cost); the scenario's
// later steps check that nothing changed.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/message_differencer.h>
#include <grpcpp/client_context.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "client/cpp/client_impl.h"
#include "client/cpp/tenant_budget_impl.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "retrybudget/clock.h"
#include "retrybudget/v1/budget.pb.h"
#include "retrybudget/v1/budget_mock.grpc.pb.h"

#ifndef RETRYBUDGET_CONFORMANCE_DIR
#error "RETRYBUDGET_CONFORMANCE_DIR must name client/conformance/scenarios"
#endif

// ClientContext keeps wait_for_ready private and befriends this class (gRPC's interop tests
// define it; this binary does not link them): the runner's way to read the flag the refresher
// set on the attempt.
namespace grpc::testing {
class InteropClientContextInspector {
 public:
  explicit InteropClientContextInspector(const grpc::ClientContext& context)
      : context_(context) {}
  bool wait_for_ready() const { return context_.wait_for_ready_; }

 private:
  const grpc::ClientContext& context_;
};
}  // namespace grpc::testing

namespace retrybudget::client_internal {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;
using WallTime = std::chrono::system_clock::time_point;

constexpr double kTimeToleranceMs = 0.001;

// ---- JSON ----

absl::StatusOr<Struct> ReadJsonFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path.string()));
  std::stringstream text;
  text << in.rdbuf();
  Struct out;
  const auto status = google::protobuf::util::JsonStringToMessage(text.str(), &out);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path.string(), " is not a JSON object: ", status.ToString()));
  }
  return out;
}

std::string ToJson(const google::protobuf::Message& message) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(message, &out, options);
  return out;
}

// `value` (an object) as a message, strictly: an unknown field is an error naming it.
absl::Status ToMessage(const Value& value, google::protobuf::Message* out,
                       const std::string& where) {
  if (!value.has_struct_value()) {
    return absl::InvalidArgumentError(absl::StrCat(where, " must be an object"));
  }
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(value, &json);
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  const auto status = google::protobuf::util::JsonStringToMessage(json, out, options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " is not a ", out->GetTypeName(), ": ", status.ToString(), ": ",
                     json));
  }
  return absl::OkStatus();
}

absl::Status CheckKeys(const Struct& object, const std::set<std::string>& allowed,
                       const std::string& where) {
  for (const auto& [key, unused] : object.fields()) {
    if (!allowed.contains(key)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " has the unknown key \"", key, "\" (allowed: ", absl::StrJoin(allowed, ", "),
          ")"));
    }
  }
  return absl::OkStatus();
}

const Value* Find(const Struct& object, const std::string& key) {
  const auto it = object.fields().find(key);
  return it == object.fields().end() ? nullptr : &it->second;
}

absl::StatusOr<double> NumberAt(const Struct& object, const std::string& key,
                                const std::string& where) {
  const Value* value = Find(object, key);
  if (value == nullptr || !value->has_number_value()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ".", key, " must be a number"));
  }
  return value->number_value();
}

absl::StatusOr<std::string> StringAt(const Struct& object, const std::string& key,
                                     const std::string& where) {
  const Value* value = Find(object, key);
  if (value == nullptr || value->kind_case() != Value::kStringValue) {
    return absl::InvalidArgumentError(absl::StrCat(where, ".", key, " must be a string"));
  }
  return value->string_value();
}

absl::StatusOr<bool> BoolAt(const Struct& object, const std::string& key,
                            const std::string& where) {
  const Value* value = Find(object, key);
  if (value == nullptr || value->kind_case() != Value::kBoolValue) {
    return absl::InvalidArgumentError(absl::StrCat(where, ".", key, " must be true or false"));
  }
  return value->bool_value();
}

absl::StatusOr<grpc::StatusCode> CodeNamed(const std::string& name, const std::string& where) {
  static const std::map<std::string, grpc::StatusCode> kCodes = {
      {"OK", grpc::StatusCode::OK},
      {"CANCELLED", grpc::StatusCode::CANCELLED},
      {"UNKNOWN", grpc::StatusCode::UNKNOWN},
      {"INVALID_ARGUMENT", grpc::StatusCode::INVALID_ARGUMENT},
      {"DEADLINE_EXCEEDED", grpc::StatusCode::DEADLINE_EXCEEDED},
      {"NOT_FOUND", grpc::StatusCode::NOT_FOUND},
      {"ALREADY_EXISTS", grpc::StatusCode::ALREADY_EXISTS},
      {"PERMISSION_DENIED", grpc::StatusCode::PERMISSION_DENIED},
      {"RESOURCE_EXHAUSTED", grpc::StatusCode::RESOURCE_EXHAUSTED},
      {"FAILED_PRECONDITION", grpc::StatusCode::FAILED_PRECONDITION},
      {"ABORTED", grpc::StatusCode::ABORTED},
      {"OUT_OF_RANGE", grpc::StatusCode::OUT_OF_RANGE},
      {"UNIMPLEMENTED", grpc::StatusCode::UNIMPLEMENTED},
      {"INTERNAL", grpc::StatusCode::INTERNAL},
      {"UNAVAILABLE", grpc::StatusCode::UNAVAILABLE},
      {"DATA_LOSS", grpc::StatusCode::DATA_LOSS},
      {"UNAUTHENTICATED", grpc::StatusCode::UNAUTHENTICATED},
  };
  const auto it = kCodes.find(name);
  if (it == kCodes.end()) {
    return absl::InvalidArgumentError(absl::StrCat(where, " is \"", name,
                                                   "\", not a gRPC status code name"));
  }
  return it->second;
}

std::string CodeName(absl::StatusCode code) {
  std::string name = absl::StatusCodeToString(code);
  for (char& c : name) c = c == ' ' ? '_' : static_cast<char>(std::toupper(c));
  return name;
}

// ---- the script of one step's attempts ----

struct Attempt {
  std::string where;  // "step 3 attempt 1", for messages
  v1::SyncRequest expect;
  std::optional<std::string> address;
  std::optional<double> timeout_ms;
  std::optional<bool> wait_for_ready;
  double after_ms = 0;
  bool lost = false;
  std::optional<v1::SyncResponse> response;
  grpc::Status error;
};

absl::StatusOr<Attempt> ParseOutcome(const Struct& object, Attempt attempt) {
  const std::string& where = attempt.where;
  const int outcomes = static_cast<int>(object.fields().contains("response")) +
                       static_cast<int>(object.fields().contains("error")) +
                       static_cast<int>(object.fields().contains("lost"));
  if (outcomes != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " must have exactly one of response, error, lost"));
  }
  if (object.fields().contains("message") && !object.fields().contains("error")) {
    return absl::InvalidArgumentError(absl::StrCat(where, ".message needs an error"));
  }
  if (object.fields().contains("after_ms")) {
    absl::StatusOr<double> after = NumberAt(object, "after_ms", where);
    if (!after.ok()) return after.status();
    attempt.after_ms = *after;
  }
  if (const Value* response = Find(object, "response"); response != nullptr) {
    attempt.response.emplace();
    if (absl::Status s = ToMessage(*response, &*attempt.response, where + ".response"); !s.ok()) {
      return s;
    }
  } else if (object.fields().contains("error")) {
    absl::StatusOr<std::string> name = StringAt(object, "error", where);
    if (!name.ok()) return name.status();
    absl::StatusOr<grpc::StatusCode> code = CodeNamed(*name, where + ".error");
    if (!code.ok()) return code.status();
    std::string message = "scripted failure";
    if (object.fields().contains("message")) {
      absl::StatusOr<std::string> text = StringAt(object, "message", where);
      if (!text.ok()) return text.status();
      message = *text;
    }
    attempt.error = grpc::Status(*code, message);
  } else {
    absl::StatusOr<bool> lost = BoolAt(object, "lost", where);
    if (!lost.ok()) return lost.status();
    if (!*lost) return absl::InvalidArgumentError(absl::StrCat(where, ".lost must be true"));
    if (object.fields().contains("after_ms")) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": lost takes no after_ms"));
    }
    attempt.lost = true;
  }
  return attempt;
}

absl::StatusOr<Attempt> ParseAttempt(const Value& value, const std::string& where,
                                     const std::string& instance_id) {
  if (!value.has_struct_value()) {
    return absl::InvalidArgumentError(absl::StrCat(where, " must be an object"));
  }
  const Struct& object = value.struct_value();
  if (absl::Status s = CheckKeys(object,
                                 {"expect", "expect_address", "expect_timeout_ms",
                                  "expect_wait_for_ready", "after_ms", "response", "error",
                                  "message", "lost"},
                                 where);
      !s.ok()) {
    return s;
  }
  Attempt attempt;
  attempt.where = where;
  const Value* expect = Find(object, "expect");
  if (expect == nullptr) return absl::InvalidArgumentError(absl::StrCat(where, " has no expect"));
  if (absl::Status s = ToMessage(*expect, &attempt.expect, where + ".expect"); !s.ok()) return s;
  if (attempt.expect.instance_id().empty()) attempt.expect.set_instance_id(instance_id);
  if (object.fields().contains("expect_address")) {
    absl::StatusOr<std::string> address = StringAt(object, "expect_address", where);
    if (!address.ok()) return address.status();
    attempt.address = *address;
  }
  if (object.fields().contains("expect_timeout_ms")) {
    absl::StatusOr<double> timeout = NumberAt(object, "expect_timeout_ms", where);
    if (!timeout.ok()) return timeout.status();
    attempt.timeout_ms = *timeout;
  }
  if (object.fields().contains("expect_wait_for_ready")) {
    absl::StatusOr<bool> wait = BoolAt(object, "expect_wait_for_ready", where);
    if (!wait.ok()) return wait.status();
    attempt.wait_for_ready = *wait;
  }
  return ParseOutcome(object, std::move(attempt));
}

double ToMs(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

// The timeout an attempt was given, known to lie in [lo, hi] (see the file comment): the
// roundest value in it (whole ms, then tenths, ...). Scenario times are written in ms with few
// decimals, so this is the timeout the refresher computed.
absl::Duration RoundestIn(absl::Duration lo, absl::Duration hi) {
  for (absl::Duration grain : {absl::Milliseconds(1), absl::Microseconds(100),
                               absl::Microseconds(10), absl::Microseconds(1)}) {
    const absl::Duration candidate = absl::Ceil(lo, grain);
    if (candidate <= hi) return candidate;
  }
  return hi;
}

// Answers the Syncs of every route (main target and owners) from one step's attempts, checking
// each request. Single-threaded: the test thread runs RunOnce() and Shutdown().
class Script {
 public:
  Script(FakeClock* clock, absl::Time start, bool redirects)
      : clock_(clock), start_(start), redirects_(redirects) {}

  // The attempts the next step must send; the wall-clock window of the first one opens now.
  void Load(std::deque<Attempt> attempts, std::string where) {
    attempts_ = std::move(attempts);
    step_ = std::move(where);
    sent_ = 0;
    window_start_ = std::chrono::system_clock::now();
  }

  // From now on every attempt fails with UNAVAILABLE, unchecked (the client's destruction after
  // a scenario without a shutdown step).
  void Silence() {
    attempts_.clear();
    silent_ = true;
  }

  // After the step: every listed attempt was sent.
  void ExpectAllSent() {
    if (!attempts_.empty()) {
      ADD_FAILURE() << step_ << ": sent " << sent_ << " attempts, " << attempts_.size()
                    << " more listed (next: " << attempts_.front().where << " expecting "
                    << ToJson(attempts_.front().expect) << ")";
    }
    attempts_.clear();
  }

  grpc::Status Sync(const std::string& address, grpc::ClientContext* context,
                    const v1::SyncRequest& request, v1::SyncResponse* response) {
    const WallTime called = std::chrono::system_clock::now();
    ++sent_;
    if (silent_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the scenario is over");
    if (attempts_.empty()) {
      ADD_FAILURE() << step_ << ": attempt " << sent_ << " sent, only " << sent_ - 1
                    << " listed; the request (to \"" << address << "\"): " << ToJson(request);
      window_start_ = std::chrono::system_clock::now();
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "attempt not in the scenario");
    }
    Attempt attempt = std::move(attempts_.front());
    attempts_.pop_front();
    CheckRequest(attempt, address, request);
    const absl::Duration timeout = CheckTimeout(attempt, *context, called);
    if (attempt.wait_for_ready.has_value()) {
      const bool wait = grpc::testing::InteropClientContextInspector(*context).wait_for_ready();
      EXPECT_EQ(wait, *attempt.wait_for_ready) << attempt.where << ": wait_for_ready";
    }
    const grpc::Status status = Answer(attempt, timeout, response);
    window_start_ = std::chrono::system_clock::now();
    return status;
  }

 private:
  void CheckRequest(const Attempt& attempt, const std::string& address,
                    const v1::SyncRequest& request) {
    std::string diff;
    google::protobuf::util::MessageDifferencer differencer;
    differencer.ReportDifferencesToString(&diff);
    if (!differencer.Compare(attempt.expect, request)) {
      ADD_FAILURE() << attempt.where << " (at " << ToMs(clock_->Now() - start_)
                    << " ms): the request differs\n  expected: " << ToJson(attempt.expect)
                    << "\n  sent:     " << ToJson(request) << "\n  differences:\n"
                    << diff;
    }
    if (attempt.address.has_value() || !redirects_) {
      EXPECT_EQ(address, attempt.address.value_or("")) << attempt.where << ": sent to";
    }
  }

  // Checks expect_timeout_ms; returns the attempt's timeout.
  absl::Duration CheckTimeout(const Attempt& attempt, const grpc::ClientContext& context,
                              WallTime called) {
    const absl::Duration lo = absl::FromChrono(context.deadline() - called);
    const absl::Duration hi = absl::FromChrono(context.deadline() - window_start_);
    if (!attempt.timeout_ms.has_value()) return RoundestIn(lo, hi);
    const double want = *attempt.timeout_ms;
    if (want < ToMs(lo) - kTimeToleranceMs || want > ToMs(hi) + kTimeToleranceMs) {
      ADD_FAILURE() << attempt.where << ": timeout " << ToMs(RoundestIn(lo, hi)) << " ms (between "
                    << ToMs(lo) << " and " << ToMs(hi) << "), expected " << want << " ms";
      return RoundestIn(lo, hi);
    }
    return absl::Milliseconds(want);
  }

  grpc::Status Answer(const Attempt& attempt, absl::Duration timeout,
                      v1::SyncResponse* response) {
    if (attempt.lost) {
      clock_->Advance(timeout);
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "lost (scripted)");
    }
    clock_->Advance(absl::Milliseconds(attempt.after_ms));
    if (attempt.response.has_value()) {
      *response = *attempt.response;
      return grpc::Status::OK;
    }
    return attempt.error;
  }

  FakeClock* const clock_;
  const absl::Time start_;
  const bool redirects_;
  std::deque<Attempt> attempts_;
  std::string step_;
  int sent_ = 0;
  bool silent_ = false;
  WallTime window_start_;
};

std::unique_ptr<v1::RetryBudgetService::StubInterface> ScriptedStub(Script* script,
                                                                    std::string address) {
  auto stub = std::make_unique<::testing::NiceMock<v1::MockRetryBudgetServiceStub>>();
  ON_CALL(*stub, Sync(::testing::_, ::testing::_, ::testing::_))
      .WillByDefault([script, address](grpc::ClientContext* context,
                                       const v1::SyncRequest& request,
                                       v1::SyncResponse* response) {
        return script->Sync(address, context, request, response);
      });
  return stub;
}

// ---- options ----

absl::StatusOr<ClientOptions> ParseOptions(const Struct* object, FakeClock* clock) {
  ClientOptions options;
  options.instance_id = "conformance";
  options.clock = clock;
  if (object != nullptr) {
    const std::string where = "options";
    if (absl::Status s = CheckKeys(*object,
                                   {"instance_id", "refresh_period_ms", "min_sync_interval_ms",
                                    "lease_burst", "sync_timeout_ms", "fallback",
                                    "fallback_capacity", "fallback_refill_per_second"},
                                   where);
        !s.ok()) {
      return s;
    }
    for (const auto& [key, value] : object->fields()) {
      if (key == "instance_id" || key == "fallback") {
        absl::StatusOr<std::string> text = StringAt(*object, key, where);
        if (!text.ok()) return text.status();
        if (key == "instance_id") {
          options.instance_id = *text;
        } else if (*text == "deny") {
          options.fallback = FallbackMode::kDeny;
        } else if (*text != "local_bucket") {
          return absl::InvalidArgumentError(
              absl::StrCat("options.fallback is \"", *text, "\"; expected local_bucket or deny"));
        }
        continue;
      }
      absl::StatusOr<double> number = NumberAt(*object, key, where);
      if (!number.ok()) return number.status();
      if (key == "refresh_period_ms") options.refresh_period = absl::Milliseconds(*number);
      if (key == "min_sync_interval_ms") options.min_sync_interval = absl::Milliseconds(*number);
      if (key == "sync_timeout_ms") options.sync_timeout = absl::Milliseconds(*number);
      if (key == "lease_burst") options.lease_burst = static_cast<uint64_t>(*number);
      if (key == "fallback_capacity") options.fallback_capacity = *number;
      if (key == "fallback_refill_per_second") options.fallback_refill_per_second = *number;
    }
  }
  return ValidateAndDefault(std::move(options));
}

// Whether any response of the scenario names an owner (then attempts without expect_address
// may go anywhere).
bool NamesAnOwner(const Value& value) {
  if (value.has_struct_value()) {
    for (const auto& [key, field] : value.struct_value().fields()) {
      if (key == "owner" && field.kind_case() == Value::kStringValue &&
          !field.string_value().empty()) {
        return true;
      }
      if (NamesAnOwner(field)) return true;
    }
  }
  if (value.has_list_value()) {
    for (const Value& item : value.list_value().values()) {
      if (NamesAnOwner(item)) return true;
    }
  }
  return false;
}

const char* ModeName(LeaseMode mode) {
  switch (mode) {
    case LeaseMode::kAwaitingLease:
      return "awaiting_lease";
    case LeaseMode::kLeased:
      return "leased";
    case LeaseMode::kExpired:
      return "expired";
    case LeaseMode::kRefused:
      return "refused";
    case LeaseMode::kFallback:
      return "fallback";
    case LeaseMode::kDenyFallback:
      return "deny_fallback";
    case LeaseMode::kShutdown:
      return "shutdown";
  }
  return "?";
}

// ---- the scenario ----

class ScenarioRunner {
 public:
  explicit ScenarioRunner(std::string name) : name_(std::move(name)) {}

  // Reads the file; a malformed scenario is a failed test.
  absl::Status Load(const std::filesystem::path& path) {
    absl::StatusOr<Struct> file = ReadJsonFile(path);
    if (!file.ok()) return file.status();
    scenario_ = *std::move(file);
    if (absl::Status s = CheckKeys(scenario_, {"name", "rules", "description", "options", "steps"},
                                   "the scenario");
        !s.ok()) {
      return s;
    }
    absl::StatusOr<std::string> name = StringAt(scenario_, "name", "the scenario");
    if (!name.ok()) return name.status();
    if (*name != name_) {
      return absl::InvalidArgumentError(
          absl::StrCat("name is \"", *name, "\" in the file ", name_, ".json"));
    }
    const Value* rules = Find(scenario_, "rules");
    if (rules == nullptr || !rules->has_list_value() || rules->list_value().values().empty()) {
      return absl::InvalidArgumentError("rules must be a list of at least one rule id");
    }
    const Value* options = Find(scenario_, "options");
    if (options != nullptr && !options->has_struct_value()) {
      return absl::InvalidArgumentError("options must be an object");
    }
    absl::StatusOr<ClientOptions> parsed =
        ParseOptions(options == nullptr ? nullptr : &options->struct_value(), &clock_);
    if (!parsed.ok()) return parsed.status();
    options_ = *std::move(parsed);
    return absl::OkStatus();
  }

  // Runs every step; stops at the first malformed one (checks that fail go on).
  absl::Status Run() {
    Value whole;
    *whole.mutable_struct_value() = scenario_;
    script_ = std::make_unique<Script>(&clock_, start_, NamesAnOwner(whole));
    StubFactory owners = [this](const std::string& address) {
      return ScriptedStub(script_.get(), address);
    };
    client_ = std::make_unique<BudgetClientImpl>(options_, ScriptedStub(script_.get(), ""),
                                                 nullptr, std::move(owners));
    const Value* steps = Find(scenario_, "steps");
    if (steps == nullptr || !steps->has_list_value()) {
      return absl::InvalidArgumentError("steps must be a list");
    }
    int index = 0;
    for (const Value& step : steps->list_value().values()) {
      if (absl::Status s = RunStep(step, ++index); !s.ok()) return s;
      if (::testing::Test::HasFatalFailure()) break;
    }
    return absl::OkStatus();
  }

  ~ScenarioRunner() {
    // The client's destructor shuts it down: its final Sync must not reach the script.
    if (client_ != nullptr) {
      script_->Silence();
      client_.reset();
    }
  }

 private:
  absl::Status RunStep(const Value& value, int index) {
    std::string where = absl::StrCat("step ", index);
    if (!value.has_struct_value()) {
      return absl::InvalidArgumentError(absl::StrCat(where, " must be an object"));
    }
    const Struct& step = value.struct_value();
    if (absl::Status s = CheckKeys(step,
                                   {"at_ms", "tenant", "try_acquire", "record_success",
                                    "record_request", "refund", "run", "shutdown",
                                    "expect_tenant", "expect", "cost"},
                                   where);
        !s.ok()) {
      return s;
    }
    absl::StatusOr<double> at = NumberAt(step, "at_ms", where);
    if (!at.ok()) return at.status();
    absl::StrAppend(&where, " (at_ms ", *at, ")");
    const absl::Time time = start_ + absl::Milliseconds(*at);
    if (time < clock_.Now()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " is earlier than the clock, at ", ToMs(clock_.Now() - start_), " ms"));
    }
    clock_.Set(time);
    std::vector<std::string> actions;
    for (const char* key : {"tenant", "try_acquire", "record_success", "record_request",
                            "refund", "run", "shutdown", "expect_tenant"}) {
      if (step.fields().contains(key)) actions.emplace_back(key);
    }
    if (actions.size() != 1) {
      return absl::InvalidArgumentError(absl::StrCat(where, " must have exactly one action, has ",
                                                     actions.size()));
    }
    const std::string& action = actions[0];
    for (const char* key : {"expect", "cost"}) {
      if (step.fields().contains(key) && action != "try_acquire" && action != "refund") {
        return absl::InvalidArgumentError(absl::StrCat(where, ": ", action, " takes no ", key));
      }
    }
    if (action == "run" || action == "shutdown") return RunSync(step, action, where);
    if (action == "expect_tenant") return ExpectTenants(step, where);
    return WorkerCall(step, action, where);
  }

  absl::StatusOr<TenantBudgetImpl*> Handle(const std::string& name, const std::string& where) {
    const auto it = tenants_.find(name);
    if (it == tenants_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": tenant \"", name, "\" was not created by a tenant step"));
    }
    return it->second;
  }

  absl::Status WorkerCall(const Struct& step, const std::string& action,
                          const std::string& where) {
    absl::StatusOr<std::string> name = StringAt(step, action, where);
    if (!name.ok()) return name.status();
    if (action == "tenant") {
      absl::StatusOr<TenantBudget*> budget = client_->Tenant(*name);
      if (!budget.ok()) return budget.status();
      // The registry makes TenantBudgetImpl handles.
      tenants_[*name] = static_cast<TenantBudgetImpl*>(*budget);
      return absl::OkStatus();
    }
    absl::StatusOr<TenantBudgetImpl*> tenant = Handle(*name, where);
    if (!tenant.ok()) return tenant.status();
    if (action == "record_success") {
      (*tenant)->RecordSuccess();
      return absl::OkStatus();
    }
    if (action == "record_request") {
      (*tenant)->RecordRequest();
      return absl::OkStatus();
    }
    absl::StatusOr<uint32_t> cost = CostAt(step, where);
    if (!cost.ok()) return cost.status();
    absl::StatusOr<std::optional<bool>> expect = WorkerExpect(step, action, *cost, where);
    if (!expect.ok()) return expect.status();
    if (action == "refund") {
      (*tenant)->Refund(*cost);  // returns nothing in C++: `expect` true/false is not checked
      return absl::OkStatus();
    }
    if (!expect->has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": try_acquire needs an expect"));
    }
    EXPECT_EQ((*tenant)->TryAcquire(*cost), **expect)
        << where << ": try_acquire " << *name << " cost " << *cost;
    return absl::OkStatus();
  }

  // The step's `cost`: 1 when left out; an integer in [0, 2^32) (out-of-range costs included).
  static absl::StatusOr<uint32_t> CostAt(const Struct& step, const std::string& where) {
    if (!step.fields().contains("cost")) return 1;
    absl::StatusOr<double> cost = NumberAt(step, "cost", where);
    if (!cost.ok()) return cost.status();
    if (*cost != std::floor(*cost) || *cost < 0 || *cost > 4294967295.0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": cost ", *cost, " is not an integer in [0, 2^32)"));
    }
    return static_cast<uint32_t>(*cost);
  }

  // A worker step's `expect`: none, true / false, or "cost_out_of_range" (false in C++), which
  // must name a cost out of range.
  static absl::StatusOr<std::optional<bool>> WorkerExpect(const Struct& step,
                                                          const std::string& action,
                                                          uint32_t cost,
                                                          const std::string& where) {
    const Value* expect = Find(step, "expect");
    const bool out_of_range = cost < 1 || cost > TenantBudget::kMaxCost;
    if (expect != nullptr && expect->has_string_value()) {
      if (expect->string_value() != "cost_out_of_range") {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": expect \"", expect->string_value(), "\" is not true, false or "
            "\"cost_out_of_range\""));
      }
      if (!out_of_range) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": expect \"cost_out_of_range\" with cost ", cost, ", which is in range"));
      }
      return std::optional<bool>(false);
    }
    if (out_of_range) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": ", action, " of cost ", cost,
          " (out of range) must expect \"cost_out_of_range\""));
    }
    if (expect == nullptr) return std::optional<bool>();
    absl::StatusOr<bool> value = BoolAt(step, "expect", where);
    if (!value.ok()) return value.status();
    return std::optional<bool>(*value);
  }

  absl::Status RunSync(const Struct& step, const std::string& action, const std::string& where) {
    const Value& body = step.fields().at(action);
    if (!body.has_struct_value()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ".", action, " must be an object"));
    }
    const Struct& object = body.struct_value();
    const std::set<std::string> keys = action == "run"
                                           ? std::set<std::string>{"attempts", "next_wake_ms"}
                                           : std::set<std::string>{"attempts", "expect_status"};
    if (absl::Status s = CheckKeys(object, keys, where + "." + action); !s.ok()) return s;
    absl::StatusOr<std::deque<Attempt>> attempts = ParseAttempts(object, where);
    if (!attempts.ok()) return attempts.status();
    script_->Load(*std::move(attempts), where);
    if (action == "shutdown") {
      const absl::Status status = client_->Shutdown();
      script_->ExpectAllSent();
      if (object.fields().contains("expect_status")) {
        absl::StatusOr<std::string> want = StringAt(object, "expect_status", where);
        if (!want.ok()) return want.status();
        EXPECT_EQ(CodeName(status.code()), *want) << where << ": shutdown returned " << status;
      }
      return absl::OkStatus();
    }
    const absl::Time next = client_->RunOnce();
    script_->ExpectAllSent();
    return CheckNextWake(object, next, where);
  }

  absl::StatusOr<std::deque<Attempt>> ParseAttempts(const Struct& object,
                                                    const std::string& where) {
    const Value* list = Find(object, "attempts");
    if (list == nullptr || !list->has_list_value()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": attempts must be a list"));
    }
    std::deque<Attempt> attempts;
    int n = 0;
    for (const Value& item : list->list_value().values()) {
      absl::StatusOr<Attempt> attempt =
          ParseAttempt(item, absl::StrCat(where, " attempt ", ++n), options_.instance_id);
      if (!attempt.ok()) return attempt.status();
      attempts.push_back(*std::move(attempt));
    }
    return attempts;
  }

  absl::Status CheckNextWake(const Struct& object, absl::Time next, const std::string& where) {
    const Value* want = Find(object, "next_wake_ms");
    if (want == nullptr) return absl::OkStatus();
    const std::string got =
        next == absl::InfiniteFuture() ? "null" : absl::StrCat(ToMs(next - start_));
    if (want->kind_case() == Value::kNullValue) {
      EXPECT_EQ(got, "null") << where << ": next_wake_ms";
      return absl::OkStatus();
    }
    if (!want->has_number_value()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": next_wake_ms must be a number or null"));
    }
    if (next == absl::InfiniteFuture() ||
        std::abs(ToMs(next - start_) - want->number_value()) > kTimeToleranceMs) {
      ADD_FAILURE() << where << ": next_wake_ms is " << got << ", expected "
                    << want->number_value();
    }
    return absl::OkStatus();
  }

  absl::Status ExpectTenants(const Struct& step, const std::string& where) {
    const Value& body = step.fields().at("expect_tenant");
    if (!body.has_struct_value()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ".expect_tenant must be an object"));
    }
    for (const auto& [name, fields] : body.struct_value().fields()) {
      absl::StatusOr<TenantBudgetImpl*> tenant = Handle(name, where);
      if (!tenant.ok()) return tenant.status();
      if (!fields.has_struct_value()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ".expect_tenant.", name,
                                                       " must be an object"));
      }
      if (absl::Status s = ExpectTenant(**tenant, fields.struct_value(),
                                        absl::StrCat(where, " tenant ", name));
          !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  }

  static absl::Status ExpectTenant(const TenantBudgetImpl& tenant, const Struct& want,
                                   const std::string& where) {
    const TenantStats stats = tenant.Stats();
    const std::map<std::string, int64_t> counters = {
        {"tokens_held", stats.tokens_held},
        {"retries_allowed", static_cast<int64_t>(stats.retries_allowed)},
        {"retries_denied", static_cast<int64_t>(stats.retries_denied)},
        {"shadow_denied", static_cast<int64_t>(stats.shadow_denied)},
        {"requests", static_cast<int64_t>(stats.requests)},
        {"requests_credited_locally", static_cast<int64_t>(stats.requests_credited_locally)},
        {"fallback_allowed", static_cast<int64_t>(stats.fallback_allowed)},
        {"successes", static_cast<int64_t>(stats.successes)},
        {"successes_credited_locally", static_cast<int64_t>(stats.successes_credited_locally)},
        {"tokens_received", static_cast<int64_t>(stats.tokens_received)},
        {"tokens_returned", static_cast<int64_t>(stats.tokens_returned)},
        {"refunds", static_cast<int64_t>(stats.refunds)},
    };
    for (const auto& [key, value] : want.fields()) {
      if (key == "shadow") {
        absl::StatusOr<bool> shadow = BoolAt(want, key, where);
        if (!shadow.ok()) return shadow.status();
        EXPECT_EQ(stats.shadow, *shadow) << where << ": shadow";
        continue;
      }
      if (key == "mode" || key == "error") {
        absl::StatusOr<std::string> text = StringAt(want, key, where);
        if (!text.ok()) return text.status();
        const std::string got =
            key == "mode" ? ModeName(tenant.mode()) : CodeName(stats.error.code());
        EXPECT_EQ(got, *text) << where << ": " << key << " (error: " << stats.error << ")";
        continue;
      }
      const auto counter = counters.find(key);
      if (counter == counters.end()) {
        return absl::InvalidArgumentError(absl::StrCat(where, " has the unknown field \"", key,
                                                       "\""));
      }
      absl::StatusOr<double> number = NumberAt(want, key, where);
      if (!number.ok()) return number.status();
      EXPECT_EQ(static_cast<double>(counter->second), *number) << where << ": " << key;
    }
    return absl::OkStatus();
  }

  const std::string name_;
  FakeClock clock_;
  const absl::Time start_ = clock_.Now();
  Struct scenario_;
  ClientOptions options_;
  std::unique_ptr<Script> script_;
  std::unique_ptr<BudgetClientImpl> client_;
  std::map<std::string, TenantBudgetImpl*> tenants_;
};

// ---- one test per scenario file ----

std::vector<std::string> ScenarioNames() {
  std::vector<std::string> names;
  const std::filesystem::path dir(RETRYBUDGET_CONFORMANCE_DIR);
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    if (entry.path().extension() == ".json") names.push_back(entry.path().stem().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

class ConformanceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ConformanceTest, Scenario) {
  const std::string& name = GetParam();
  ScenarioRunner runner(name);
  const std::filesystem::path path =
      std::filesystem::path(RETRYBUDGET_CONFORMANCE_DIR) / (name + ".json");
  const absl::Status loaded = runner.Load(path);
  ASSERT_TRUE(loaded.ok()) << path.string() << ": " << loaded;
  const absl::Status ran = runner.Run();
  EXPECT_TRUE(ran.ok()) << path.string() << ": " << ran;
}

// Test names must be identifiers: a scenario name that is not one fails the test of the corpus.
std::string TestName(const ::testing::TestParamInfo<std::string>& info) {
  std::string name = info.param;
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
}

INSTANTIATE_TEST_SUITE_P(Corpus, ConformanceTest, ::testing::ValuesIn(ScenarioNames()), TestName);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(ConformanceTest);

TEST(ConformanceCorpus, HasScenarios) {
  EXPECT_FALSE(ScenarioNames().empty()) << "no scenario in " << RETRYBUDGET_CONFORMANCE_DIR;
}

}  // namespace
}  // namespace retrybudget::client_internal
