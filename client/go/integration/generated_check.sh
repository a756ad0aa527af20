#!/usr/bin/env bash
# Fails when the committed client/go/budgetpb differs from what client/go/generate.sh makes of
# proto/ now (a changed proto without regenerated stubs, a hand edit, other generator versions).
# Usage: generated_check.sh SOURCE_ROOT PROTOC PLUGIN_DIR
set -uo pipefail
src=$1
protoc=$2
plugins=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! "$src/client/go/generate.sh" "$tmp/budgetpb" "$src/proto" "$protoc" "$plugins"; then
  echo "generate.sh failed" >&2
  exit 1
fi
if ! diff -ru "$src/client/go/budgetpb" "$tmp/budgetpb" >&2; then
  echo "client/go/budgetpb is not what generate.sh makes of proto/ (diff above: committed," \
    "regenerated); run: client/go/generate.sh client/go/budgetpb proto $protoc $plugins" >&2
  exit 1
fi
echo "client/go/budgetpb matches proto/"
