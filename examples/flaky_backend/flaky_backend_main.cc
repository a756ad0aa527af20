// flaky-backend: serves FlakyEcho until SIGINT or SIGTERM.
//
//   flaky-backend --address=127.0.0.1:50061 --failure_probability=0.4 --pushback_ms=200
#include <csignal>
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "flaky_backend.h"

ABSL_FLAG(std::string, address, "127.0.0.1:50061", "Address to listen on (port 0: any free port)");
ABSL_FLAG(double, failure_probability, 0.3, "Chance in [0, 1] that a call fails UNAVAILABLE");
ABSL_FLAG(std::string, pushback_ms, "",
          "If set, failures carry this grpc-retry-pushback-ms trailer (e.g. 200, or -1)");
ABSL_FLAG(int, hold_ms, 0, "Each call waits this long before answering (or until cancelled)");
ABSL_FLAG(uint64_t, seed, 1, "Seed of the failure draws");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const double p = absl::GetFlag(FLAGS_failure_probability);
  if (!(p >= 0.0 && p <= 1.0)) {
    std::fprintf(stderr, "flaky-backend: --failure_probability must be in [0, 1], got %g\n", p);
    return 2;
  }
  retrybudget::examples::FlakyOptions options;
  options.failure_probability = p;
  if (!absl::GetFlag(FLAGS_pushback_ms).empty()) options.pushback_ms = absl::GetFlag(FLAGS_pushback_ms);
  options.hold = absl::Milliseconds(absl::GetFlag(FLAGS_hold_ms));
  options.seed = absl::GetFlag(FLAGS_seed);

  // Block the signals before gRPC starts its threads, then wait for them here.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto backend = retrybudget::examples::FlakyBackend::Start(absl::GetFlag(FLAGS_address), options);
  if (!backend.ok()) {
    std::fprintf(stderr, "flaky-backend: %s\n", backend.status().ToString().c_str());
    return 1;
  }
  std::printf("flaky-backend listening on %s (failure_probability=%g)\n",
              (*backend)->target().c_str(), p);
  std::fflush(stdout);
  int sig = 0;
  sigwait(&signals, &sig);
  (*backend)->Shutdown();
  std::printf("flaky-backend: %d calls served\n", (*backend)->service().call_count());
  return 0;
}
