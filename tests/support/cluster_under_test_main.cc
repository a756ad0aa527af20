// cluster-under-test: the launcher's ClusterUnderTest (a real 3-node etcd cluster on loopback and
// N real retry-budget servers in cluster mode) as a process, for the tests of the clients that
// are not C++ (Python, Go, JavaScript) and for tools/fleet/mixed_fleet.py. One launcher for every
// language: they drive this binary instead of starting etcd and servers of their own.
//
//   cluster-under-test --server-bin=PATH [--servers=3] [--shards=8] [--etcd-lease-ttl=2s]
//                      [--policy=FILE] [--server-arg=ARG]...
//
// Once every server has joined and the shards are balanced it prints one JSON line on stdout:
//   {"target":"ipv4:127.0.0.1:A,...","servers":[{"index":0,"address":"127.0.0.1:A","pid":N},...],
//    "etcd_endpoints":"127.0.0.1:E1,..."}
// then reads commands on stdin, one a line, and answers each with one JSON line, {"ok":true,...}
// or {"ok":false,"error":"..."}:
//   owner TENANT       {"ok":true,"index":I,"address":"127.0.0.1:P"} once the shard has an owner
//   kill I             kill -9 of server I (and waits until it is dead)
//   restart I          starts server I again on its port, waits until it serves
//   pause I / resume I SIGSTOP / SIGCONT
//   wait-balanced      every shard owned, no owner changed for two reconcile periods
//   servers            the "servers" array again (pids change with restarts)
//   quit               (or end of stdin) kills everything and exits 0
// Exit codes: 0 after quit or end of input, 1 when the cluster does not start, 2 for bad flags.
// Nothing it runs outlives it: everything is killed on exit, and when stdin closes (the driver
// died) it exits as after quit.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "tests/support/test_launcher.h"

namespace retrybudget::testing {
namespace {

struct Flags {
  std::string server_bin;
  int servers = 3;
  int shards = 8;
  absl::Duration etcd_lease_ttl = absl::Seconds(2);
  std::string policy_file;
  std::vector<std::string> server_args;
};

std::string JsonString(absl::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppend(&out, "\\u00", absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string Error(const absl::Status& status) {
  return absl::StrCat("{\"ok\":false,\"error\":", JsonString(status.ToString()), "}");
}

// Flags are `--name=value`; `-` and `_` are the same in names, as in the fleet tool.
absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    std::string name;
    absl::string_view value;
    if (!absl::ConsumePrefix(&arg, "--")) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", argv[i], "'"));
    }
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(arg, absl::MaxSplits('=', 1));
    for (char c : kv.first) name += (c == '_') ? '-' : c;
    value = kv.second;
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, "=", value, ": ", why));
    };
    if (name == "server-bin") {
      flags.server_bin = std::string(value);
    } else if (name == "servers") {
      if (!absl::SimpleAtoi(value, &flags.servers) || flags.servers < 1 || flags.servers > 16) {
        return bad("a whole number from 1 to 16");
      }
    } else if (name == "shards") {
      if (!absl::SimpleAtoi(value, &flags.shards) || flags.shards < 1 || flags.shards > 4096) {
        return bad("a whole number from 1 to 4096");
      }
    } else if (name == "etcd-lease-ttl") {
      if (!absl::ParseDuration(value, &flags.etcd_lease_ttl) ||
          flags.etcd_lease_ttl < absl::Seconds(2)) {
        return bad("a duration of at least 2s");
      }
    } else if (name == "policy") {
      flags.policy_file = std::string(value);
    } else if (name == "server-arg") {
      flags.server_args.emplace_back(value);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
  }
  if (flags.server_bin.empty()) return absl::InvalidArgumentError("--server-bin is required");
  if (access(flags.server_bin.c_str(), X_OK) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--server-bin=", flags.server_bin, ": not an executable file"));
  }
  return flags;
}

std::string ServersJson(ClusterUnderTest& cluster) {
  std::string out = "[";
  for (int i = 0; i < cluster.server_count(); ++i) {
    if (i > 0) out += ",";
    absl::StrAppend(&out, "{\"index\":", i, ",\"address\":",
                    JsonString(cluster.server(i).address()), ",\"pid\":", cluster.server(i).pid(),
                    "}");
  }
  return out + "]";
}

// One command line -> one JSON line; *quit is set by `quit`.
std::string Run(ClusterUnderTest& cluster, absl::string_view line, bool* quit) {
  std::vector<absl::string_view> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
  if (words.empty()) return Error(absl::InvalidArgumentError("empty command"));
  absl::string_view command = words[0];
  auto ok = [](const absl::Status& s) { return s.ok() ? std::string("{\"ok\":true}") : Error(s); };
  if (command == "quit") {
    *quit = true;
    return "{\"ok\":true}";
  }
  if (command == "wait-balanced") return ok(cluster.WaitUntilBalanced(absl::Seconds(30)));
  if (command == "servers") return absl::StrCat("{\"ok\":true,\"servers\":", ServersJson(cluster), "}");
  if (words.size() != 2) {
    return Error(absl::InvalidArgumentError(absl::StrCat("'", command, "' takes one argument")));
  }
  if (command == "owner") {
    absl::StatusOr<int> owner = cluster.WaitForOwner(words[1], absl::Seconds(30));
    if (!owner.ok()) return Error(owner.status());
    return absl::StrCat("{\"ok\":true,\"index\":", *owner, ",\"address\":",
                        JsonString(cluster.server(*owner).address()), "}");
  }
  int i = -1;
  if (!absl::SimpleAtoi(words[1], &i) || i < 0 || i >= cluster.server_count()) {
    return Error(absl::InvalidArgumentError(
        absl::StrCat("server index '", words[1], "' is not in [0, ", cluster.server_count(), ")")));
  }
  if (command == "kill") return ok(cluster.KillServer(i));
  if (command == "restart") return ok(cluster.RestartServer(i));
  if (command == "pause") return ok(cluster.PauseServer(i));
  if (command == "resume") return ok(cluster.ResumeServer(i));
  return Error(absl::InvalidArgumentError(absl::StrCat("unknown command '", command, "'")));
}

// SIGTERM / SIGINT interrupt the read of stdin (no SA_RESTART), so the loop ends and the
// cluster's destructor kills what it started, as at the end of input.
void OnTerminate(int) {}

int Main(int argc, char** argv) {
  struct sigaction action = {};
  action.sa_handler = OnTerminate;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  absl::StatusOr<Flags> flags = ParseFlags(argc, argv);
  if (!flags.ok()) {
    std::cerr << "cluster-under-test: " << flags.status().message() << "\n";
    return 2;
  }
  ClusterUnderTestOptions options;
  options.servers = flags->servers;
  options.server_binary = flags->server_bin;
  options.shards = flags->shards;
  options.lease_ttl = flags->etcd_lease_ttl;
  if (!flags->policy_file.empty()) {
    options.server_flags.push_back(absl::StrCat("--policy=", flags->policy_file));
  }
  for (const std::string& arg : flags->server_args) options.server_flags.push_back(arg);
  absl::StatusOr<std::unique_ptr<ClusterUnderTest>> cluster =
      ClusterUnderTest::Start(std::move(options));
  if (!cluster.ok()) {
    std::cerr << "cluster-under-test: " << cluster.status() << "\n";
    return 1;
  }
  absl::Status balanced = (*cluster)->WaitUntilBalanced(absl::Seconds(30));
  if (!balanced.ok()) {
    std::cerr << "cluster-under-test: " << balanced << "\n";
    return 1;
  }
  std::cout << "{\"target\":" << JsonString((*cluster)->target())
            << ",\"servers\":" << ServersJson(**cluster)
            << ",\"etcd_endpoints\":" << JsonString((*cluster)->etcd().etcd_endpoints()) << "}"
            << std::endl;
  std::string line;
  bool quit = false;
  while (!quit && std::getline(std::cin, line)) {
    absl::string_view trimmed = absl::StripAsciiWhitespace(line);
    if (trimmed.empty()) continue;
    std::cout << Run(**cluster, trimmed, &quit) << std::endl;
  }
  return 0;  // the ClusterUnderTest's destructor kills every server and etcd node
}

}  // namespace
}  // namespace retrybudget::testing

int main(int argc, char** argv) { return retrybudget::testing::Main(argc, argv); }
