#!/usr/bin/env bash
# The installed CMake package works for a project outside the tree:
#   1. cmake --install BUILD_DIR into a temporary prefix;
#   2. the exported files reference neither the build tree nor the source tree;
#   3. tests/ops/consumer is configured with CMAKE_PREFIX_PATH=<prefix>, built, and run against
#      the real server binary on loopback (it leases, spends one retry, reports a success).
# Usage: package_test.sh BUILD_DIR CONSUMER_SRC SERVER_BINARY CMAKE
set -euo pipefail
build_dir=$1 consumer_src=$2 server=$3 cmake=$4
source_dir=$(cd "$consumer_src/../../.." && pwd)

tmp=$(mktemp -d "${TMPDIR:-/tmp}/retrybudget-package.XXXXXX")
server_pid=""
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

echo "== cmake --install $build_dir --prefix $tmp/prefix"
"$cmake" --install "$build_dir" --prefix "$tmp/prefix" > "$tmp/install.log" 2>&1 \
  || { cat "$tmp/install.log"; fail "cmake --install failed"; }
config=$(find "$tmp/prefix" -name retrybudgetConfig.cmake)
[ -n "$config" ] || fail "no retrybudgetConfig.cmake installed"
for header in retrybudget/client.h retrybudget/retry.h retrybudget/clock.h \
              retrybudget/v1/budget.pb.h retrybudget/v1/budget.grpc.pb.h; do
  [ -f "$tmp/prefix/include/$header" ] || fail "header $header not installed"
done
if grep -rl -e "$build_dir" -e "$source_dir/" "$tmp/prefix/lib" --include='*.cmake'; then
  fail "the installed package references the build or source tree (files above)"
fi

echo "== configure and build tests/ops/consumer against the installed package"
"$cmake" -S "$consumer_src" -B "$tmp/consumer-build" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$tmp/prefix" > "$tmp/configure.log" 2>&1 \
  || { cat "$tmp/configure.log"; fail "configuring the consumer failed"; }
"$cmake" --build "$tmp/consumer-build" -j2 > "$tmp/build.log" 2>&1 \
  || { cat "$tmp/build.log"; fail "building the consumer failed"; }

echo "== run it against the real server"
"$server" --listen=127.0.0.1:0 --port_file="$tmp/port" --metrics_listen= > "$tmp/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 100); do [ -s "$tmp/port" ] && break; sleep 0.1; done
[ -s "$tmp/port" ] || { cat "$tmp/server.log"; fail "the server did not start"; }
"$tmp/consumer-build/consumer" "127.0.0.1:$(cat "$tmp/port")" || fail "the consumer failed"
echo "PASS"
