#!/usr/bin/env bash
# Installs the Debian packages retry-budget needs, only those missing. Used by `make run`,
# `make test` and CI, so a fresh Debian bookworm machine needs nothing done by hand.
set -euo pipefail

packages=(
  cmake g++ make pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  prometheus-cpp-dev libspdlog-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  redis-server prometheus docker-compose openssl python3-grpcio
  libhiredis-dev gnuplot-nox
  libssl-dev clang libclang-rt-14-dev python3
  etcd-server etcd-client
  golang-etcd-server-dev golang-github-gogo-protobuf-dev golang-github-grpc-ecosystem-grpc-gateway-dev
  # The Go client (client/go); protoc-gen-go{,-grpc} are built from these sources (Debian's protoc-gen-go conflicts with golang-goprotobuf-dev, which etcd's packages need)
  golang-go golang-google-grpc-dev golang-google-protobuf-dev golang-github-prometheus-client-golang-dev
  golang-github-cenkalti-backoff-dev  # client/go/backoffbudget, the cenkalti/backoff/v4 adapter
  python3-protobuf python3-pytest python3-pytest-asyncio python3-tenacity python3-prometheus-client python3-venv python3-pip
  # The Python client's wheel (pip wheel --no-build-isolation: Debian's setuptools and wheel build it)
  python3-setuptools python3-wheel
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js and npm, for the JS client (client/js; its npm packages come from package-lock.json
# through `npm ci`): Debian's packages only where the commands are missing. A Node.js build that
# bundles its own npm needs no npm package, and Debian's would conflict with it.
command -v node > /dev/null 2>&1 || missing+=(nodejs)
command -v npm > /dev/null 2>&1 || missing+=(npm)
[ ${#missing[@]} -eq 0 ] && exit 0

echo "installing missing packages: ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  sudo=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
