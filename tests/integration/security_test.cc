// Transport security and bearer credentials through the real binary. Certificates are generated
// at test time with the openssl CLI into a temporary directory (never committed): a CA, a server
// certificate for 127.0.0.1 / localhost, a client certificate, and a second, untrusted CA with a
// client certificate of its own.
#include <signal.h>

#include <atomic>
#include <cstdlib>
#include <functional>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "tests/integration/server_process.h"

namespace retrybudget::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// Runs `script` with sh in `dir`; fails the test (with the script's output) if it fails.
bool Shell(const std::string& dir, const std::string& script) {
  const std::string log = dir + "/shell.log";
  const std::string command =
      absl::StrCat("cd '", dir, "' && (", script, ") >'", log, "' 2>&1");
  if (std::system(command.c_str()) != 0) {
    ADD_FAILURE() << "failed: " << script << "\n" << ReadFile(log);
    return false;
  }
  return true;
}

// The test PKI, generated once per test binary run.
struct Pki {
  std::string dir;
  std::string ca, server_cert, server_key, client_cert, client_key;
  std::string rogue_client_cert, rogue_client_key;  // signed by a CA the server does not trust
};

const Pki& TestPki() {
  static Pki* const pki = [] {
    static ScopedTempDir* const dir = new ScopedTempDir();
    auto* p = new Pki();
    p->dir = dir->path();
    const std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    const std::string ca = absl::StrCat(
        "openssl req -x509 ", key, " -days 2 -keyout NAME.key -out NAME.pem -subj /CN=NAME "
        "-addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign");
    auto leaf = [&](const std::string& name, const std::string& issuer, const std::string& ext) {
      return absl::StrCat("openssl req ", key, " -keyout ", name, ".key -out ", name,
                          ".csr -subj /CN=", name, " && printf '", ext, "' > ", name,
                          ".ext && openssl x509 -req -days 2 -in ", name, ".csr -CA ", issuer,
                          ".pem -CAkey ", issuer, ".key -CAcreateserial -out ", name,
                          ".pem -extfile ", name, ".ext");
    };
    const std::string script = absl::StrCat(
        absl::StrReplaceAll(ca, {{"NAME", "ca"}}), " && ",
        absl::StrReplaceAll(ca, {{"NAME", "rogue-ca"}}), " && ",
        leaf("server", "ca",
             "subjectAltName=IP:127.0.0.1,DNS:localhost\\nextendedKeyUsage=serverAuth\\n"),
        " && ", leaf("client", "ca", "extendedKeyUsage=clientAuth\\n"), " && ",
        leaf("rogue-client", "rogue-ca", "extendedKeyUsage=clientAuth\\n"));
    Shell(p->dir, script);
    p->ca = p->dir + "/ca.pem";
    p->server_cert = p->dir + "/server.pem";
    p->server_key = p->dir + "/server.key";
    p->client_cert = p->dir + "/client.pem";
    p->client_key = p->dir + "/client.key";
    p->rogue_client_cert = p->dir + "/rogue-client.pem";
    p->rogue_client_key = p->dir + "/rogue-client.key";
    return p;
  }();
  return *pki;
}

std::shared_ptr<grpc::ChannelCredentials> TlsClient(const std::string& cert = "",
                                                    const std::string& key = "") {
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = ReadFile(TestPki().ca);
  if (!cert.empty()) {
    options.pem_cert_chain = ReadFile(cert);
    options.pem_private_key = ReadFile(key);
  }
  return grpc::SslCredentials(options);
}

ServerConnection Connect(const ServerProcess& server,
                         std::shared_ptr<grpc::ChannelCredentials> credentials,
                         std::string token = "") {
  ServerConnection c =
      ServerConnection::Create(server.target(), std::move(credentials), std::move(token));
  c.deadline = absl::Seconds(5);
  return c;
}

// ---- TLS and mutual TLS ----

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_FALSE(TestPki().ca.empty()); }
  std::vector<std::string> TlsArgs() {
    return {"--tls_cert=" + TestPki().server_cert, "--tls_key=" + TestPki().server_key};
  }
  ScopedTempDir dir_;
};

TEST_F(TlsTest, TlsClientIsServedAndPlaintextClientIsRefused) {
  auto server = ServerProcess::Start(dir_.path(), TlsArgs());
  ASSERT_NE(server, nullptr);
  EXPECT_THAT(server->Output(), HasSubstr("TLS: certificate"));
  EXPECT_THAT(server->Output(), Not(HasSubstr("INSECURE")));

  ServerConnection tls = Connect(*server, TlsClient());
  v1::SyncResponse r;
  const grpc::Status ok = tls.Sync(SyncOf("i", 1, "t", 3), &r);
  ASSERT_TRUE(ok.ok()) << ok.error_code() << " " << ok.error_message();
  EXPECT_EQ(r.tenants(0).granted(), 3u);

  ServerConnection plain = Connect(*server, grpc::InsecureChannelCredentials());
  const grpc::Status refused = plain.Sync(SyncOf("p", 1, "plain", 3), &r);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE) << refused.error_message();
  v1::BudgetStatus budget;
  EXPECT_EQ(tls.GetBudget("plain", &budget).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(server->Stop(SIGTERM), 0);
}

TEST_F(TlsTest, MutualTlsNeedsAClientCertificateFromTheTrustedCa) {
  std::vector<std::string> args = TlsArgs();
  args.push_back("--tls_client_ca=" + TestPki().ca);
  auto server = ServerProcess::Start(dir_.path(), args);
  ASSERT_NE(server, nullptr);
  EXPECT_THAT(server->Output(), HasSubstr("client certificates required"));

  v1::SyncResponse r;
  ServerConnection with_cert =
      Connect(*server, TlsClient(TestPki().client_cert, TestPki().client_key));
  const grpc::Status ok = with_cert.Sync(SyncOf("i", 1, "t", 3), &r);
  ASSERT_TRUE(ok.ok()) << ok.error_code() << " " << ok.error_message();

  ServerConnection without_cert = Connect(*server, TlsClient());
  EXPECT_EQ(without_cert.Sync(SyncOf("n", 1, "no-cert", 3), &r).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  ServerConnection rogue =
      Connect(*server, TlsClient(TestPki().rogue_client_cert, TestPki().rogue_client_key));
  EXPECT_EQ(rogue.Sync(SyncOf("r", 1, "rogue", 3), &r).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  ServerConnection plain = Connect(*server, grpc::InsecureChannelCredentials());
  EXPECT_EQ(plain.Sync(SyncOf("p", 1, "plain", 3), &r).error_code(),
            grpc::StatusCode::UNAVAILABLE);

  // None of the refused callers created anything.
  v1::ListBudgetsResponse list;
  ASSERT_TRUE(with_cert.ListBudgets(&list).ok());
  ASSERT_EQ(list.budgets_size(), 1);
  EXPECT_EQ(list.budgets(0).tenant(), "t");
  EXPECT_EQ(server->Stop(SIGTERM), 0);
}

struct BadStart {
  std::string name;
  std::function<std::vector<std::string>()> args;
  std::vector<std::string> expected;
};

void PrintTo(const BadStart& b, std::ostream* os) { *os << b.name; }

class BadTransportFlagsTest : public ::testing::TestWithParam<BadStart> {};

TEST_P(BadTransportFlagsTest, ExitsTwoSayingWhy) {
  ScopedTempDir dir;
  const ExitResult result = RunToExit(dir.path(), GetParam().args());
  EXPECT_EQ(result.code, 2) << result.output;
  for (const std::string& e : GetParam().expected) EXPECT_THAT(result.output, HasSubstr(e));
  EXPECT_THAT(result.output, Not(HasSubstr("listening on")));
}

INSTANTIATE_TEST_SUITE_P(
    Table, BadTransportFlagsTest,
    ::testing::Values(
        BadStart{"PlaintextOnAllInterfaces", [] { return std::vector<std::string>{"--listen=0.0.0.0:0"}; },
                 {"0.0.0.0:0", "not a loopback address", "--allow_insecure_non_loopback"}},
        BadStart{"CertWithoutKey",
                 [] { return std::vector<std::string>{"--tls_cert=" + TestPki().server_cert}; },
                 {"--tls_cert and --tls_key"}},
        BadStart{"ClientCaWithoutCert",
                 [] { return std::vector<std::string>{"--tls_client_ca=" + TestPki().ca}; },
                 {"--tls_client_ca needs --tls_cert"}},
        BadStart{"MissingCertFile",
                 [] {
                   return std::vector<std::string>{"--tls_cert=/nonexistent/cert.pem",
                                                   "--tls_key=" + TestPki().server_key};
                 },
                 {"/nonexistent/cert.pem", "cannot be read"}},
        BadStart{"KeyOfAnotherCertificate",
                 [] {
                   return std::vector<std::string>{"--tls_cert=" + TestPki().server_cert,
                                                   "--tls_key=" + TestPki().client_key};
                 },
                 {"is not the private key of"}},
        BadStart{"KeyFileIsACertificate",
                 [] {
                   return std::vector<std::string>{"--tls_cert=" + TestPki().server_cert,
                                                   "--tls_key=" + TestPki().ca};
                 },
                 {"--tls_key", "no unencrypted PEM private key"}}),
    [](const auto& info) { return info.param.name; });

TEST(InsecureNonLoopbackTest, ServesWhenExplicitlyAllowedAndSaysInsecure) {
  absl::StatusOr<std::unique_ptr<ServerUnderTest>> server = ServerUnderTest::Start(
      {.binary = ServerBinary(), .flags = {"--listen=0.0.0.0:0", "--allow_insecure_non_loopback"}});
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_THAT((*server)->Log(), HasSubstr("INSECURE"));
  (*server)->Signal(SIGTERM);
  EXPECT_EQ((*server)->WaitForExit(absl::Seconds(20)), 0);
}

// ---- bearer credentials ----

// The SHA-256 of `token` as lowercase hex, computed the way the README tells operators to.
std::string Sha256Hex(const std::string& dir, const std::string& token) {
  Shell(dir, absl::StrCat("printf %s '", token, "' | sha256sum | cut -d' ' -f1 > sha"));
  return std::string(absl::StripAsciiWhitespace(ReadFile(dir + "/sha")));
}

constexpr char kAlphaToken[] = "alpha-secret-token-1";
constexpr char kBetaToken[] = "beta-secret-token-2";
constexpr char kOpsToken[] = "ops-secret-token-3";

std::string CredentialsPolicy(const std::string& dir) {
  // No refill and no credit: a level changes only when something is applied.
  return absl::StrCat(
      "default_policy { capacity: 100 refill_per_second: 0 success_credit: 0 }\n"
      "credentials { name: \"alpha\" token_sha256: \"", Sha256Hex(dir, kAlphaToken),
      "\" tenants: \"a\" tenants: \"shared\" }\n"
      "credentials { name: \"beta\" token_sha256: \"", Sha256Hex(dir, kBetaToken),
      "\" tenants: \"b\" }\n"
      "credentials { name: \"ops\" token_sha256: \"", Sha256Hex(dir, kOpsToken),
      "\" admin: true }\n");
}

enum class Call { kSyncA, kSyncB, kSyncAAndB, kGetA, kListBudgets, kPutPolicyA, kDeleteA };

struct AuthCase {
  std::string name;
  std::string token;  // empty: no authorization metadata
  Call call;
  grpc::StatusCode code;
  std::string message;
};

void PrintTo(const AuthCase& c, std::ostream* os) { *os << c.name; }

class BearerCredentialsTest : public ::testing::TestWithParam<AuthCase> {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScopedTempDir();
    const std::string policy = dir_->path() + "/policy.textproto";
    WriteFile(policy, CredentialsPolicy(dir_->path()));
    server_ = ServerProcess::Start(dir_->path(), {"--policy=" + policy}).release();
    ASSERT_NE(server_, nullptr);
    // Budgets a and b exist, each with some tokens leased out.
    v1::SyncResponse r;
    ASSERT_TRUE(server_->Connect(kAlphaToken).Sync(SyncOf("wa", 1, "a", 10), &r).ok());
    ASSERT_TRUE(server_->Connect(kBetaToken).Sync(SyncOf("wb", 1, "b", 20), &r).ok());
  }
  static void TearDownTestSuite() {
    delete server_;
    delete dir_;
  }

  // Everything an admin can see; must be unchanged by a refusal.
  static std::string Everything() {
    v1::ListBudgetsResponse list;
    EXPECT_TRUE(server_->Connect(kOpsToken).ListBudgets(&list).ok());
    return list.SerializeAsString();
  }

  static grpc::Status Run(Call call, ServerConnection& c) {
    static std::atomic<uint64_t> seq{10};
    v1::SyncResponse r;
    v1::BudgetStatus b;
    v1::ListBudgetsResponse list;
    switch (call) {
      case Call::kSyncA:
        return c.Sync(SyncOf("wa", ++seq, "a", 1, 10), &r);
      case Call::kSyncB:
        return c.Sync(SyncOf("wb", ++seq, "b", 1, 20), &r);
      case Call::kSyncAAndB: {
        v1::SyncRequest req = SyncOf("wab", ++seq, "a", 1);
        req.add_tenants()->set_tenant("b");
        req.mutable_tenants(1)->set_want(1);
        return c.Sync(req, &r);
      }
      case Call::kGetA:
        return c.GetBudget("a", &b);
      case Call::kListBudgets:
        return c.ListBudgets(&list);
      case Call::kPutPolicyA: {
        v1::BudgetPolicy p;
        p.set_capacity(5000);
        return c.PutPolicy("a", p, &b);
      }
      case Call::kDeleteA:
        return c.DeleteBudget("a");
    }
    return grpc::Status::CANCELLED;
  }

  static ScopedTempDir* dir_;
  static ServerProcess* server_;
};

ScopedTempDir* BearerCredentialsTest::dir_ = nullptr;
ServerProcess* BearerCredentialsTest::server_ = nullptr;

TEST_P(BearerCredentialsTest, IsRefusedAsSpecifiedAndARefusalChangesNothing) {
  ASSERT_NE(server_, nullptr);
  ServerConnection c = server_->Connect(GetParam().token);
  const std::string before = Everything();
  const grpc::Status status = Run(GetParam().call, c);
  EXPECT_EQ(status.error_code(), GetParam().code) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr(GetParam().message));
  EXPECT_THAT(status.error_message(), Not(HasSubstr("secret-token")));
  if (!status.ok()) {
    EXPECT_EQ(Everything(), before) << "a refused call changed state";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Table, BearerCredentialsTest,
    ::testing::Values(
        AuthCase{"NoTokenSync", "", Call::kSyncA, grpc::StatusCode::UNAUTHENTICATED,
                 "no `authorization: Bearer"},
        AuthCase{"UnknownTokenSync", "not-a-token", Call::kSyncA,
                 grpc::StatusCode::UNAUTHENTICATED, "matches no credential"},
        AuthCase{"NoTokenAdmin", "", Call::kListBudgets, grpc::StatusCode::UNAUTHENTICATED, ""},
        AuthCase{"TenantCredentialOwnTenant", kAlphaToken, Call::kSyncA, grpc::StatusCode::OK, ""},
        AuthCase{"TenantCredentialOtherTenant", kAlphaToken, Call::kSyncB,
                 grpc::StatusCode::PERMISSION_DENIED, "does not cover tenant \"b\""},
        AuthCase{"TenantCredentialMixedRequest", kAlphaToken, Call::kSyncAAndB,
                 grpc::StatusCode::PERMISSION_DENIED, "nothing in the request was applied"},
        AuthCase{"OtherTenantCredentialOwnTenant", kBetaToken, Call::kSyncB, grpc::StatusCode::OK,
                 ""},
        AuthCase{"TenantCredentialGetBudget", kAlphaToken, Call::kGetA,
                 grpc::StatusCode::PERMISSION_DENIED, "not an admin credential"},
        AuthCase{"TenantCredentialListBudgets", kBetaToken, Call::kListBudgets,
                 grpc::StatusCode::PERMISSION_DENIED, "not an admin credential"},
        AuthCase{"TenantCredentialPutPolicy", kAlphaToken, Call::kPutPolicyA,
                 grpc::StatusCode::PERMISSION_DENIED, "not an admin credential"},
        AuthCase{"TenantCredentialDeleteBudget", kAlphaToken, Call::kDeleteA,
                 grpc::StatusCode::PERMISSION_DENIED, "not an admin credential"},
        AuthCase{"AdminCredentialGetBudget", kOpsToken, Call::kGetA, grpc::StatusCode::OK, ""},
        AuthCase{"AdminCredentialListBudgets", kOpsToken, Call::kListBudgets,
                 grpc::StatusCode::OK, ""},
        AuthCase{"AdminCredentialCannotSpend", kOpsToken, Call::kSyncA,
                 grpc::StatusCode::PERMISSION_DENIED, "does not cover tenant \"a\""}),
    [](const auto& info) { return info.param.name; });

TEST_F(BearerCredentialsTest, AdminCredentialChangesPolicyKeepingTheLevel) {
  ASSERT_NE(server_, nullptr);
  ServerConnection ops = server_->Connect(kOpsToken);
  v1::BudgetStatus before, after;
  ASSERT_TRUE(ops.GetBudget("shared", &before).error_code() == grpc::StatusCode::NOT_FOUND);
  v1::SyncResponse r;
  ASSERT_TRUE(server_->Connect(kAlphaToken).Sync(SyncOf("ws", 1, "shared", 30), &r).ok());
  ASSERT_TRUE(ops.GetBudget("shared", &before).ok());
  v1::BudgetPolicy p;
  p.set_capacity(500);
  ASSERT_TRUE(ops.PutPolicy("shared", p, &after).ok());
  EXPECT_EQ(after.policy().capacity(), 500);
  EXPECT_EQ(after.tokens(), before.tokens());
}

TEST_F(BearerCredentialsTest, RefusalsAreLoggedOncePerCredentialPerMinuteWithoutTheToken) {
  ASSERT_NE(server_, nullptr);
  ServerConnection alpha = server_->Connect(kAlphaToken);
  for (int i = 0; i < 20; ++i) EXPECT_FALSE(Run(Call::kSyncB, alpha).ok());
  ServerConnection beta = server_->Connect(kBetaToken);
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(Run(Call::kGetA, beta).ok());
  const std::string log = server_->Output();
  EXPECT_THAT(log, Not(HasSubstr("secret-token")));
  int alpha_lines = 0;
  int beta_lines = 0;
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    if (!absl::StrContains(line, "auth: ")) continue;
    alpha_lines += absl::StrContains(line, "credential \"alpha\"");
    beta_lines += absl::StrContains(line, "credential \"beta\"");
  }
  // The table above may already have logged one line for each; never more within a minute.
  EXPECT_EQ(alpha_lines, 1) << log;
  EXPECT_EQ(beta_lines, 1) << log;
}

TEST(BearerOverMutualTlsTest, BothLayersApply) {
  ScopedTempDir dir;
  const std::string policy = dir.path() + "/policy.textproto";
  WriteFile(policy, CredentialsPolicy(dir.path()));
  auto server = ServerProcess::Start(
      dir.path(), {"--policy=" + policy, "--tls_cert=" + TestPki().server_cert,
                   "--tls_key=" + TestPki().server_key, "--tls_client_ca=" + TestPki().ca});
  ASSERT_NE(server, nullptr);
  auto mtls = [&] { return TlsClient(TestPki().client_cert, TestPki().client_key); };
  v1::SyncResponse r;
  ServerConnection alpha = Connect(*server, mtls(), kAlphaToken);
  EXPECT_TRUE(alpha.Sync(SyncOf("i", 1, "a", 2), &r).ok());
  ServerConnection anonymous = Connect(*server, mtls());
  EXPECT_EQ(anonymous.Sync(SyncOf("j", 1, "a", 2), &r).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(server->Stop(SIGTERM), 0);
}

}  // namespace
}  // namespace retrybudget::testing
