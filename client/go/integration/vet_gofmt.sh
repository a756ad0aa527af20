#!/usr/bin/env bash
# Fails when gofmt would reformat a Go file of the project or go vet reports anything.
# Usage: vet_gofmt.sh SOURCE_ROOT MODULE (GOPATH etc. in the environment, see CMakeLists.txt)
set -uo pipefail
src=$1
module=$2
status=0
dirs=("$src/client/go" "$src/examples/go_worker" "$src/tools/fleet/go_worker")
unformatted=$("$RETRYBUDGET_GOFMT" -l "${dirs[@]}")
if [ -n "$unformatted" ]; then
  echo "gofmt -l lists files that are not gofmt'ed:" >&2
  echo "$unformatted" >&2
  status=1
fi
if ! "$RETRYBUDGET_GO" vet -tags integration "$module" "$module/budgetpb" "$module/backoffbudget" "$module/integration" "$module/examples/go_worker" "$module/tools/go_worker"; then
  echo "go vet failed" >&2
  status=1
fi
[ $status -eq 0 ] && echo "gofmt and go vet: clean"
exit $status
