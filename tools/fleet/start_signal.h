// The start signal of a fleet run and the timeline grid it fixes (tools/fleet/README.md, "The
// worker protocol").
//
// The tool reads the bucket level (the run's start, t0 of the bound) and then writes to every
// worker, its own and every foreign one, the line
//
//   go <t0: CLOCK_MONOTONIC in whole microseconds>
//
// Every worker, whatever its language and however long it takes to wake up and make its client,
// counts its timelines on the grid that starts at t0: slice i is [t0 + i * slice, t0 + (i + 1)
// * slice) on the machine's monotonic clock, which every process of the run reads alike (C++
// std::chrono::steady_clock, Go via clock_gettime, Node's process.hrtime, Python's
// time.monotonic). So the fleet's timelines add up slice by slice with each call in the slice in
// which it started, whoever started late. The origin is truncated to the microsecond: at most
// 1 us before t0, so no call is ever counted in a slice earlier than the one it started in.
// A bare `go` (mixed_fleet.py's driver, the workers' own tests) makes the moment it was read
// the origin. Each worker echoes the origin it used (`timeline_origin_us`), which the tool checks.
//
//   const int64_t origin = MonotonicMicros(t0);
//   worker.WriteStdin(StartSignalLine(origin) + "\n");
//   ...  // in the worker:
//   absl::StatusOr<std::chrono::steady_clock::time_point> o = ParseStartSignal(line, now);
//   ++timeline[TimelineSliceOf(*o, call_start, slice)];
#ifndef RETRYBUDGET_TOOLS_FLEET_START_SIGNAL_H_
#define RETRYBUDGET_TOOLS_FLEET_START_SIGNAL_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace retrybudget::fleet {

// `t` on CLOCK_MONOTONIC (what steady_clock reads on Linux) in whole microseconds, rounded
// down; and back.
int64_t MonotonicMicros(std::chrono::steady_clock::time_point t);
std::chrono::steady_clock::time_point FromMonotonicMicros(int64_t micros);

// "go <origin_micros>" (no newline).
std::string StartSignalLine(int64_t origin_micros);

// The timeline origin a start signal gives a worker that read it at `now`: the line's origin,
// or `now` for a bare "go". INVALID_ARGUMENT naming the line for anything else, for an origin
// that is not a non-negative integer, and for one after `now` (not this machine's monotonic
// clock).
absl::StatusOr<std::chrono::steady_clock::time_point> ParseStartSignal(
    absl::string_view line, std::chrono::steady_clock::time_point now);

// The slice of a call started at `at` on the grid of `slice` from `origin` (0 for a call
// before the origin, which a worker of the protocol never makes).
size_t TimelineSliceOf(std::chrono::steady_clock::time_point origin,
                       std::chrono::steady_clock::time_point at,
                       std::chrono::steady_clock::duration slice);

}  // namespace retrybudget::fleet

#endif  // RETRYBUDGET_TOOLS_FLEET_START_SIGNAL_H_
