#!/usr/bin/env bash
# The Go client as a user outside the repository gets it: client/go alone (what a module
# download holds: the committed budgetpb, no proto/, no generator) copied into a temporary
# GOPATH beside Debian's /usr/share/gocode, exactly as client/go/README.md's install recipe
# says. Builds and vets every package there (no generation step), then builds a small worker
# outside the module that imports it and runs it against the real server: a first call that
# fails once then succeeds (through Do, then through backoffbudget.Retry) must get its success.
#
# Usage: module_copy_test.sh SOURCE_ROOT (GO, RETRY_BUDGET_SERVER_BIN in the environment)
set -euo pipefail
src=$1
go=${RETRYBUDGET_GO:-go}
gocode=${RETRYBUDGET_GOCODE:-/usr/share/gocode}
server=${RETRY_BUDGET_SERVER_BIN:?RETRY_BUDGET_SERVER_BIN is not set}

tmp=$(mktemp -d)
server_pid=""
cleanup() {
  if [ -n "$server_pid" ]; then kill -9 "$server_pid" 2>/dev/null || true; fi
  chmod -R u+w "$tmp" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
case "$tmp" in "$src"/*) echo "the temporary directory $tmp is inside the repository" >&2; exit 1;; esac

# --- the README's recipe (client/go/README.md, "Installing it") ---
export GO111MODULE=off GOFLAGS= GOPROXY=off GOPATH="$tmp/gopath:$gocode" GOCACHE="$tmp/cache"
mod="$tmp/gopath/src/github.com/retry-budget/retry-budget/client/go"
mkdir -p "$(dirname "$mod")" "$tmp/gopath/src/github.com/cenkalti/backoff"
cp -r "$src/client/go" "$mod"
ln -s "$gocode/src/github.com/cenkalti/backoff" "$tmp/gopath/src/github.com/cenkalti/backoff/v4"
# --- end of the recipe ---

if [ ! -f "$mod/budgetpb/budget.pb.go" ] || [ -e "$mod/budgetpb/retrybudget" ]; then
  echo "the copied module lacks the committed budgetpb" >&2
  exit 1
fi
chmod -R a-w "$mod" # a module cache is read-only: nothing may be generated or written there
(cd "$mod" && "$go" build ./... && "$go" vet ./...)
echo "client/go alone: go build ./... and go vet ./... passed"

worker="$tmp/gopath/src/example.com/worker"
mkdir -p "$worker"
cat > "$worker/main.go" <<'EOF'
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/cenkalti/backoff/v4"
	retrybudget "github.com/retry-budget/retry-budget/client/go"
	"github.com/retry-budget/retry-budget/client/go/backoffbudget"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func main() {
	opts := retrybudget.DefaultClientOptions()
	opts.Target = os.Args[1]
	client, err := retrybudget.NewClient(opts)
	if err != nil {
		panic(err)
	}
	defer client.Close()
	budget, err := client.Tenant("copy-worker")
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The very first action: a call that fails once (a retryable gRPC code) then succeeds.
	attempts := 0
	err = retrybudget.Do(ctx, budget, func(ctx context.Context, a retrybudget.Attempt) error {
		attempts = a.Number
		if a.Number == 1 {
			return status.Error(codes.Unavailable, "backend restarting")
		}
		return nil
	})
	fmt.Printf("do: err=%v attempts=%d\n", err, attempts)
	calls := 0
	err = backoffbudget.Retry(ctx, budget, backoff.NewConstantBackOff(10*time.Millisecond), func() error {
		calls++
		if calls == 1 {
			return errors.New("flaky")
		}
		return nil
	})
	fmt.Printf("backoff: err=%v calls=%d\n", err, calls)
	s := budget.Stats()
	fmt.Printf("stats: allowed=%d denied=%d successes=%d mode=%v\n", s.RetriesAllowed,
		s.RetriesDenied, s.Successes, s.Mode)
}
EOF
(cd "$worker" && "$go" vet . && "$go" build -o "$tmp/worker" .)

mkdir -p "$tmp/server"
"$server" --listen=127.0.0.1:0 --port_file="$tmp/server/port" --metrics_listen= \
  --data_dir="$tmp/server" > "$tmp/server/output" 2>&1 &
server_pid=$!
for _ in $(seq 1 2000); do
  [ -s "$tmp/server/port" ] && break
  sleep 0.01
done
port=$(cat "$tmp/server/port")
out=$(cd "$tmp" && env -i PATH=/usr/bin:/bin "$tmp/worker" "127.0.0.1:$port")
echo "$out"
expected="do: err=<nil> attempts=2
backoff: err=<nil> calls=2
stats: allowed=2 denied=0 successes=2 mode=lease"
if [ "$out" != "$expected" ]; then
  echo "the worker built from the copied module did not get its successes; expected:" >&2
  echo "$expected" >&2
  exit 1
fi
echo "the copied module's worker got its first retries granted"
