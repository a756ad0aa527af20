// Transport security of the gRPC port: TLS / mutual TLS credentials from PEM files, and the rule
// that plaintext is served on loopback only unless explicitly allowed.
//
//   auto credentials = LoadTlsCredentials({.cert_file = "server.pem", .key_file = "server.key",
//                                          .client_ca_file = "ca.pem"});
//   if (!credentials.ok()) return credentials.status();  // names the file and what is wrong
//   options.credentials = *credentials;
#ifndef RETRYBUDGET_SERVER_TRANSPORT_SECURITY_H_
#define RETRYBUDGET_SERVER_TRANSPORT_SECURITY_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/security/server_credentials.h"

namespace retrybudget {

struct TlsFiles {
  // PEM certificate chain of the server (leaf first) and its private key. Both or neither.
  std::string cert_file;
  std::string key_file;
  // PEM CA certificate(s). When set, clients must present a certificate signed by one of them
  // (GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY): mutual TLS. Needs cert/key.
  std::string client_ca_file;

  bool enabled() const { return !cert_file.empty() || !key_file.empty(); }
  bool mutual() const { return !client_ca_file.empty(); }
};

// Reads and checks the files (each parses as PEM, the key matches the certificate) and returns
// the server credentials. INVALID_ARGUMENT naming the flag, the file and the problem. Must not be
// called when !files.enabled() and files.client_ca_file is empty (there is nothing to load).
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> LoadTlsCredentials(const TlsFiles& files);

// True when `host` (the host part of a listen address, brackets allowed) can only be reached from
// this machine: "localhost", 127.0.0.0/8, ::1. False for wildcards ("0.0.0.0", "::", "") and
// every other address or name.
bool IsLoopbackHost(absl::string_view host);

// The host part of "host:port" / "[v6]:port"; the whole string if there is no colon.
absl::string_view ListenHost(absl::string_view listen);

}  // namespace retrybudget

#endif  // RETRYBUDGET_SERVER_TRANSPORT_SECURITY_H_
