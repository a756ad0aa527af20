#!/usr/bin/env bash
# Lays out the GOPATH the Go client, its tests and its programs build in (GO111MODULE=off),
# entirely inside the build tree, and generates the example's protobuf / gRPC stubs into it:
#
#   BUILD/gopath/src/MODULE/                *.go of client/go (symlinks)
#   BUILD/gopath/src/MODULE/budgetpb/       client/go/budgetpb (committed; symlinks)
#   BUILD/gopath/src/MODULE/backoffbudget/  client/go/backoffbudget (symlinks)
#   BUILD/gopath/src/MODULE/flakypb/        flaky.pb.go, flaky_grpc.pb.go (generated: examples only)
#   BUILD/gopath/src/MODULE/integration/    client/go/integration (symlinks; build tag integration)
#   BUILD/gopath/src/MODULE/examples/go_worker, .../tools/go_worker (symlinks)
#   BUILD/gopath/src/github.com/cenkalti/backoff/v4  Debian's .../cenkalti/backoff (the module's
#                                           /v4 import path, which GOPATH mode does not map)
#   BUILD/bin/protoc-gen-go{,-grpc}         built from Debian's sources (generate.sh, the check
#                                           of budgetpb)
#   BUILD/cache                             GOCACHE
#
# Usage: gopath.sh SOURCE_ROOT BUILD_DIR PROTOC
# Dependencies come from Debian's /usr/share/gocode (second GOPATH entry); see README.md.
set -euo pipefail
src=$1
build=$2
protoc=$3
module=github.com/retry-budget/retry-budget/client/go
gocode=${RETRYBUDGET_GOCODE:-/usr/share/gocode}

export GO111MODULE=off GOFLAGS= GOPATH="$build/gopath:$gocode" GOCACHE="$build/cache"
export GOTMPDIR="$build/tmp"
mkdir -p "$build/bin" "$build/cache" "$build/tmp"

root="$build/gopath/src/$module"
link_dir() {  # link_dir SOURCE_DIR DEST_DIR: every .go file of SOURCE_DIR, and nothing stale
  mkdir -p "$2"
  find "$2" -maxdepth 1 -type l -name '*.go' -delete
  for f in "$1"/*.go; do
    if [ -e "$f" ]; then ln -sf "$f" "$2/$(basename "$f")"; fi
  done
}
link_dir "$src/client/go" "$root"
link_dir "$src/client/go/budgetpb" "$root/budgetpb"
link_dir "$src/client/go/backoffbudget" "$root/backoffbudget"
link_dir "$src/client/go/integration" "$root/integration"
link_dir "$src/examples/go_worker" "$root/examples/go_worker"
link_dir "$src/tools/fleet/go_worker" "$root/tools/go_worker"
# Earlier layouts generated budgetpb here; the committed files replace them. The integration
# tests were tests/go, linked as gotest/.
rm -rf "$root/budgetpb/retrybudget" "$root/gotest"
cenkalti="$build/gopath/src/github.com/cenkalti/backoff"
mkdir -p "$cenkalti"
ln -sfn "$gocode/src/github.com/cenkalti/backoff" "$cenkalti/v4"

# The code generators, from the sources of golang-google-protobuf-dev and golang-google-grpc-dev
# (Debian's protoc-gen-go package conflicts with golang-goprotobuf-dev, which etcd's packages
# pull in).
for gen in google.golang.org/protobuf/cmd/protoc-gen-go google.golang.org/grpc/cmd/protoc-gen-go-grpc; do
  out="$build/bin/$(basename "$gen")"
  [ -x "$out" ] || go build -o "$out" "$gen"
done

generate() {  # generate PROTO_DIR PROTO_FILE PACKAGE_DIR
  local dir="$root/$3" m="M$2=$module/$3"
  mkdir -p "$dir"
  "$protoc" --proto_path="$1" \
    --plugin=protoc-gen-go="$build/bin/protoc-gen-go" \
    --plugin=protoc-gen-go-grpc="$build/bin/protoc-gen-go-grpc" \
    --go_out="$dir" --go_opt=paths=source_relative --go_opt="$m" \
    --go-grpc_out="$dir" --go-grpc_opt=paths=source_relative --go-grpc_opt="$m" \
    "$1/$2"
  # source_relative keeps the proto's directories; the package is flat.
  find "$dir" -mindepth 2 -name '*.pb.go' -exec mv -f {} "$dir/" \;
}
generate "$src/examples/flaky_backend" flaky.proto flakypb
