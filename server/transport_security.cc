#include "server/transport_security.h"

#include <arpa/inet.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "grpcpp/security/server_credentials.h"

namespace retrybudget {
namespace {

absl::StatusOr<std::string> ReadFile(absl::string_view flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", path, " cannot be read"));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// The last OpenSSL error as text, and the error queue cleared.
std::string OpenSslError() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "no PEM block found";
  char buf[256];
  ERR_error_string_n(code, buf, sizeof(buf));
  return buf;
}

struct BioDeleter {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Deleter {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyDeleter {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};

std::unique_ptr<BIO, BioDeleter> MemBio(const std::string& pem) {
  return std::unique_ptr<BIO, BioDeleter>(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

absl::StatusOr<std::unique_ptr<X509, X509Deleter>> ParseCert(absl::string_view flag,
                                                            const std::string& path,
                                                            const std::string& pem) {
  auto bio = MemBio(pem);
  std::unique_ptr<X509, X509Deleter> cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (cert == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, ": ", path, " holds no PEM certificate (", OpenSslError(), ")"));
  }
  return cert;
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> LoadTlsCredentials(const TlsFiles& files) {
  if (files.cert_file.empty() || files.key_file.empty()) {
    return absl::InvalidArgumentError(
        files.mutual() && !files.enabled()
            ? "--tls_client_ca needs --tls_cert and --tls_key (mutual TLS is TLS plus client "
              "certificates)"
            : "--tls_cert and --tls_key go together: set both or neither");
  }
  absl::StatusOr<std::string> cert_pem = ReadFile("--tls_cert", files.cert_file);
  if (!cert_pem.ok()) return cert_pem.status();
  absl::StatusOr<std::string> key_pem = ReadFile("--tls_key", files.key_file);
  if (!key_pem.ok()) return key_pem.status();

  auto cert = ParseCert("--tls_cert", files.cert_file, *cert_pem);
  if (!cert.ok()) return cert.status();
  {
    auto bio = MemBio(*key_pem);
    std::unique_ptr<EVP_PKEY, PkeyDeleter> key(
        PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
    if (key == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--tls_key: ", files.key_file, " holds no unencrypted PEM private key (",
          OpenSslError(), ")"));
    }
    if (X509_check_private_key(cert->get(), key.get()) != 1) {
      ERR_clear_error();
      return absl::InvalidArgumentError(absl::StrCat("--tls_key: ", files.key_file,
                                                     " is not the private key of --tls_cert ",
                                                     files.cert_file));
    }
  }

  grpc::SslServerCredentialsOptions options(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  options.pem_key_cert_pairs.push_back({*key_pem, *cert_pem});
  if (files.mutual()) {
    absl::StatusOr<std::string> ca_pem = ReadFile("--tls_client_ca", files.client_ca_file);
    if (!ca_pem.ok()) return ca_pem.status();
    if (auto ca = ParseCert("--tls_client_ca", files.client_ca_file, *ca_pem); !ca.ok()) {
      return ca.status();
    }
    options.pem_root_certs = *ca_pem;
    options.client_certificate_request =
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(options);
}

absl::string_view ListenHost(absl::string_view listen) {
  const size_t colon = listen.rfind(':');
  if (colon == absl::string_view::npos) return listen;
  return listen.substr(0, colon);
}

bool IsLoopbackHost(absl::string_view host) {
  if (absl::ConsumePrefix(&host, "[")) {
    if (!absl::ConsumeSuffix(&host, "]")) return false;
  }
  if (absl::EqualsIgnoreCase(host, "localhost")) return true;
  const std::string h(host);
  in_addr v4{};
  if (inet_pton(AF_INET, h.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6{};
  if (inet_pton(AF_INET6, h.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    // ::ffff:127.x.x.x
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
  }
  return false;
}

}  // namespace retrybudget
