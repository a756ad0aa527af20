# retry-budget: the server, budgetctl and the fleet tool, built and run on Debian bookworm with
# Debian's packages (no vendored dependencies).
#
#   docker build -t retry-budget .
#   docker run --rm -p 50051:50051 -p 9464:9464 retry-budget
#
# docker-compose.yml runs it with Prometheus, Grafana and a demo worker fleet.

# ---- build ----
FROM debian:bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      cmake g++ make pkg-config \
      libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev \
      prometheus-cpp-dev libspdlog-dev libssl-dev libhiredis-dev \
      golang-etcd-server-dev golang-github-gogo-protobuf-dev \
      golang-github-grpc-ecosystem-grpc-gateway-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cmake -S . -B /build -DCMAKE_BUILD_TYPE=Release \
      -DRETRYBUDGET_BUILD_TESTS=OFF -DRETRYBUDGET_BUILD_BENCH=OFF \
 && cmake --build /build -j"$(nproc)" --target retry-budget-server budgetctl retry-budget-fleet \
 && install -D -m 0755 -t /out/bin \
      /build/server/retry-budget-server /build/tools/budgetctl/budgetctl \
      /build/tools/fleet/retry-budget-fleet

# ---- runtime: only the shared libraries the binaries load ----
FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      libgrpc++1.51 libgrpc29 libprotobuf32 libabsl20220623 libre2-9 libc-ares2 \
      libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 libcivetweb1 \
      libspdlog1.10 libfmt9 libssl3 ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --home-dir /var/lib/retry-budget --create-home retry-budget
COPY --from=build /out/bin/ /usr/local/bin/
USER retry-budget
WORKDIR /var/lib/retry-budget
VOLUME ["/var/lib/retry-budget"]
# gRPC, Prometheus /metrics.
EXPOSE 50051 9464
# Inside a container the server must listen on all interfaces; put TLS in front (--tls_cert,
# --tls_key) or keep the network private, as docker-compose.yml does.
ENTRYPOINT ["retry-budget-server"]
CMD ["--listen=0.0.0.0:50051", "--allow_insecure_non_loopback", \
     "--metrics_listen=0.0.0.0:9464", "--data_dir=/var/lib/retry-budget"]
