// The run's own CA (comms/run_ca.h): files and modes, bus.tls decided per
// start, and a real broker over TLS that a client trusting the run's CA
// reaches while a plaintext client and one trusting another run's CA do not.
#include "comms/run_ca.h"

#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <memory>

#include "common/file_util.h"
#include "comms/auth.h"
#include "comms/bus_client.h"
#include "comms/bus_server.h"
#include "plan/agent_env.h"

using namespace agentrt;
using namespace std::chrono_literals;

namespace {

constexpr char kSecret[] = "run-ca-test-secret-0123456789abc";

std::filesystem::path TempDir() {
  char tmpl[] = "/tmp/run_ca_test.XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  return tmpl;
}

unsigned Mode(const std::string& path) {
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  return st.st_mode & 0777;
}

// The certificate in a PEM file, for its names.
std::unique_ptr<X509, void (*)(X509*)> ReadCertificate(const std::string& path) {
  const auto pem = ReadWholeFile(path);
  REQUIRE(pem.ok());
  BIO* bio = BIO_new_mem_buf(pem->data(), static_cast<int>(pem->size()));
  X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  REQUIRE(cert != nullptr);
  return {cert, X509_free};
}

Status PublishOnce(const std::string& address, BusClientOptions options,
                   const std::string& agent = "a") {
  options.call_timeout = 3s;
  auto client = BusClient::Connect(address, Credential{agent, DeriveAgentToken(kSecret, agent)},
                                   std::move(options));
  if (!client.ok()) return client.status();
  return (*client)->Publish("t", "over the wire").status();
}

}  // namespace

TEST_CASE("bus.tls is decided per start: auto is on beyond loopback") {
  const auto tmp = TempDir();
  const RunDir dir(tmp.string());
  BusPlan loopback;  // tls: auto, the default
  REQUIRE(PrepareBusTls(dir, loopback, false, {}).ok());
  CHECK(loopback.settings.tls == "off");
  CHECK_FALSE(loopback.run_ca);
  CHECK(loopback.settings.ClientCaFile().empty());
  CHECK_FALSE(std::filesystem::exists(dir.RunCaKeyPath()));

  BusPlan off;
  off.settings.tls = "off";
  REQUIRE(PrepareBusTls(dir, off, true, {}).ok());
  CHECK(off.settings.tls == "off");

  BusPlan own;  // the user's certificate is kept
  own.settings.tls = "on";
  own.settings.cert_file = "/etc/mine.pem";
  own.settings.key_file = "/etc/mine.key";
  REQUIRE(PrepareBusTls(dir, own, false, {}).ok());
  CHECK_FALSE(own.run_ca);
  CHECK(own.settings.ClientCaFile() == "/etc/mine.pem");
  CHECK_FALSE(std::filesystem::exists(dir.RunCaKeyPath()));

  BusPlan across;
  REQUIRE(PrepareBusTls(dir, across, true, {}).ok());
  CHECK(across.settings.tls == "on");
  CHECK(across.run_ca);
  CHECK(across.settings.cert_file == dir.BusCertPath());
  CHECK(across.settings.key_file == dir.BusKeyPath());
  CHECK(across.settings.ClientCaFile() == dir.RunCaPath());
  CHECK(Mode(dir.SecretsDir()) == 0700);
  CHECK(Mode(dir.RunCaPath()) == 0600);
  CHECK(Mode(dir.RunCaKeyPath()) == 0600);

  // The CA is made once: a second start (resume, requeue) keeps it.
  const auto first_ca = ReadWholeFile(dir.RunCaPath());
  REQUIRE(first_ca.ok());
  BusPlan again = across;
  REQUIRE(PrepareBusTls(dir, again, true, {}).ok());
  CHECK(ReadWholeFile(dir.RunCaPath()).value() == *first_ca);
  std::filesystem::remove_all(tmp);
}

TEST_CASE("a CA whose making was cut short after its key is made anew") {
  const auto tmp = TempDir();
  const RunDir dir(tmp.string());
  REQUIRE(EnsureRunCa(dir).ok());
  const auto first_key = ReadWholeFile(dir.RunCaKeyPath()).value();
  REQUIRE(::unlink(dir.RunCaPath().c_str()) == 0);  // the certificate is written last
  REQUIRE(EnsureRunCa(dir).ok());
  CHECK(std::filesystem::exists(dir.RunCaPath()));
  CHECK(ReadWholeFile(dir.RunCaKeyPath()).value() != first_key);
  REQUIRE(IssueBusCertificate(dir, {}).ok());  // and it signs
  std::filesystem::remove_all(tmp);
}

TEST_CASE("a CA key others may read is refused") {
  const auto tmp = TempDir();
  const RunDir dir(tmp.string());
  REQUIRE(EnsureRunCa(dir).ok());
  REQUIRE(::chmod(dir.RunCaKeyPath().c_str(), 0644) == 0);
  const Status s = EnsureRunCa(dir);
  CHECK(s.code() == StatusCode::kPermissionDenied);
  CHECK_THAT(s.message(), Catch::Contains(dir.RunCaKeyPath()));
  std::filesystem::remove_all(tmp);
}

TEST_CASE("the broker's certificate names its host, and only the run's CA is trusted") {
  const auto tmp = TempDir();
  const RunDir dir(tmp.string());
  BusPlan bus;
  bus.settings.tls = "on";
  REQUIRE(PrepareBusTls(dir, bus, false, {}).ok());
  REQUIRE(IssueBusCertificate(dir, {"10.9.8.7", "node-7"}).ok());
  CHECK(Mode(dir.BusKeyPath()) == 0600);
  {
    auto cert = ReadCertificate(dir.BusCertPath());
    CHECK(X509_check_host(cert.get(), "node-7", 0, 0, nullptr) == 1);
    CHECK(X509_check_host(cert.get(), "localhost", 0, 0, nullptr) == 1);
    CHECK(X509_check_ip_asc(cert.get(), "10.9.8.7", 0) == 1);
    CHECK(X509_check_ip_asc(cert.get(), "127.0.0.1", 0) == 1);
    CHECK(X509_check_host(cert.get(), "node-8", 0, 0, nullptr) != 1);
    CHECK(X509_check_ip_asc(cert.get(), "10.9.8.8", 0) != 1);
    auto ca = ReadCertificate(dir.RunCaPath());
    CHECK(X509_check_issued(ca.get(), cert.get()) == X509_V_OK);
  }

  BusServerOptions options;
  options.host = "127.0.0.1";
  options.tls_cert_file = bus.settings.cert_file;
  options.tls_key_file = bus.settings.key_file;
  BusAcl acl;
  acl.agents = {"a"};
  acl.channels = {{"t", {"a"}, {"a"}}};
  auto server = BusServer::Start(options, kSecret, acl);
  REQUIRE(server.ok());
  const std::string port = std::to_string((*server)->port());

  BusClientOptions trusting;
  trusting.tls_ca_file = bus.settings.ClientCaFile();
  CHECK(PublishOnce("127.0.0.1:" + port, trusting).ok());
  CHECK(PublishOnce("localhost:" + port, trusting).ok());
  CHECK_FALSE(PublishOnce("127.0.0.1:" + port, BusClientOptions{}).ok());  // plaintext

  const auto other_tmp = TempDir();
  const RunDir other(other_tmp.string());
  REQUIRE(EnsureRunCa(other).ok());
  BusClientOptions stranger;
  stranger.tls_ca_file = other.RunCaPath();
  CHECK_FALSE(PublishOnce("127.0.0.1:" + port, stranger).ok());

  // A start on another node signs a new certificate under the same CA.
  REQUIRE(IssueBusCertificate(dir, {"10.9.8.8"}).ok());
  CHECK(X509_check_ip_asc(ReadCertificate(dir.BusCertPath()).get(), "10.9.8.8", 0) == 1);
  (*server)->Shutdown();
  std::filesystem::remove_all(tmp);
  std::filesystem::remove_all(other_tmp);
}

TEST_CASE("bus.mtls: each agent's certificate names it, and the broker holds the token to it") {
  const auto tmp = TempDir();
  const RunDir dir(tmp.string());
  BusPlan bus;
  bus.settings.tls = "on";
  bus.settings.mtls = true;
  REQUIRE(PrepareBusTls(dir, bus, false, {"a", "b"}).ok());
  REQUIRE(IssueBusCertificate(dir, {}).ok());
  for (const std::string agent : {"a", "b"}) {
    CHECK(Mode(dir.ClientKeyPath(agent)) == 0600);
    auto cert = ReadCertificate(dir.ClientCertPath(agent));
    char cn[64] = {};
    X509_NAME_get_text_by_NID(X509_get_subject_name(cert.get()), NID_commonName, cn, sizeof cn);
    CHECK(std::string(cn) == agent);
  }
  // Made once: a later start keeps them (and adds a newcomer's).
  const auto a_cert = ReadWholeFile(dir.ClientCertPath("a")).value();
  REQUIRE(IssueClientCertificates(dir, {"a", "c"}).ok());
  CHECK(ReadWholeFile(dir.ClientCertPath("a")).value() == a_cert);
  CHECK(std::filesystem::exists(dir.ClientCertPath("c")));

  BusServerOptions options;
  options.host = "127.0.0.1";
  options.tls_cert_file = bus.settings.cert_file;
  options.tls_key_file = bus.settings.key_file;
  options.tls_client_ca_file = bus.settings.ClientCaFile();
  options.tls_client_is_agent = true;
  BusAcl acl;
  acl.agents = {"a", "b"};
  acl.channels = {{"t", {"a", "b"}, {"a", "b"}}};
  auto server = BusServer::Start(options, kSecret, acl);
  REQUIRE(server.ok());
  const std::string address = "127.0.0.1:" + std::to_string((*server)->port());
  auto as = [&](const std::string& holder) {
    BusClientOptions o;
    o.tls_ca_file = dir.RunCaPath();
    o.tls_cert_file = dir.ClientCertPath(holder);
    o.tls_key_file = dir.ClientKeyPath(holder);
    return o;
  };
  CHECK(PublishOnce(address, as("a"), "a").ok());
  CHECK(PublishOnce(address, as("b"), "b").ok());
  // b's token with a's certificate: the token alone is no longer enough.
  const Status swapped = PublishOnce(address, as("a"), "b");
  CHECK(swapped.code() == StatusCode::kUnauthenticated);
  CHECK_THAT(swapped.message(), Catch::Contains("the client certificate names a, not agent b"));
  BusClientOptions no_certificate;
  no_certificate.tls_ca_file = dir.RunCaPath();
  CHECK_FALSE(PublishOnce(address, no_certificate, "a").ok());

  // An agent's token file names its certificate; BusClient::ForAgent presents it.
  REQUIRE(WriteTokenFile(dir.TokenPath("b"), {"b", DeriveAgentToken(kSecret, "b"),
                                              dir.ClientCertPath("b"), dir.ClientKeyPath("b")})
              .ok());
  AgentEnv env;
  env.agent = "b";
  env.bus = address;
  env.token_file = dir.TokenPath("b");
  env.bus_ca_file = dir.RunCaPath();
  BusClientOptions quick;
  quick.call_timeout = 3s;
  auto client = BusClient::ForAgent(env, quick);
  REQUIRE(client.ok());
  CHECK((*client)->Publish("t", "with my certificate").ok());
  (*server)->Shutdown();
  std::filesystem::remove_all(tmp);
}
