#include "comms/run_ca.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <functional>
#include <memory>

#include "common/file_util.h"

namespace agentrt {
namespace {

// A CA lives as long as the run may (a month of requeues and resumes, with
// room); a server certificate is made anew at every start.
constexpr long kCaValidSeconds = 5L * 365 * 24 * 3600;
constexpr long kServerValidSeconds = 400L * 24 * 3600;
// A node whose clock runs behind the one that signed still accepts it.
constexpr long kClockSkewSeconds = 24L * 3600;

struct Freer {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
  void operator()(X509* p) const { X509_free(p); }
  void operator()(BIO* p) const { BIO_free(p); }
  void operator()(BIGNUM* p) const { BN_free(p); }
  void operator()(X509_EXTENSION* p) const { X509_EXTENSION_free(p); }
};
template <typename T>
using Owned = std::unique_ptr<T, Freer>;

// The newest OpenSSL error, after what was being done.
Status OpenSslError(std::string_view what) {
  const unsigned long code = ERR_get_error();
  char text[256] = "unknown error";
  if (code != 0) ERR_error_string_n(code, text, sizeof text);
  ERR_clear_error();
  return Internal(fmt::format("run CA: {}: {}", what, text));
}

Result<std::string> Pem(const std::function<int(BIO*)>& write, std::string_view what) {
  Owned<BIO> bio(BIO_new(BIO_s_mem()));
  if (!bio || write(bio.get()) != 1) return OpenSslError(what);
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(size));
}

Result<Owned<EVP_PKEY>> NewKey() {
  Owned<EVP_PKEY> key(EVP_EC_gen("P-256"));
  if (!key) return OpenSslError("cannot make a P-256 key");
  return key;
}

Status AddExtension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  Owned<X509_EXTENSION> ext(X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str()));
  if (!ext || X509_add_ext(cert, ext.get(), -1) != 1)
    return OpenSslError(fmt::format("cannot add {} = {}", OBJ_nid2sn(nid), value));
  return Status::Ok();
}

// A certificate for `key` named `common_name`, valid from a day ago for
// `valid_s`, with a random serial; signed by `issuer` (nullptr: itself).
Result<Owned<X509>> NewCertificate(EVP_PKEY* key, const std::string& common_name, long valid_s,
                                   X509* issuer, EVP_PKEY* issuer_key,
                                   const std::vector<std::pair<int, std::string>>& extensions) {
  Owned<X509> cert(X509_new());
  Owned<BIGNUM> serial(BN_new());
  if (!cert || !serial || X509_set_version(cert.get(), X509_VERSION_3) != 1 ||
      BN_rand(serial.get(), 127, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) != 1 ||
      BN_to_ASN1_INTEGER(serial.get(), X509_get_serialNumber(cert.get())) == nullptr ||
      X509_gmtime_adj(X509_getm_notBefore(cert.get()), -kClockSkewSeconds) == nullptr ||
      X509_gmtime_adj(X509_getm_notAfter(cert.get()), valid_s) == nullptr ||
      X509_NAME_add_entry_by_txt(X509_get_subject_name(cert.get()), "CN", MBSTRING_UTF8,
                                 reinterpret_cast<const unsigned char*>(common_name.c_str()), -1,
                                 -1, 0) != 1 ||
      X509_set_issuer_name(cert.get(), X509_get_subject_name(issuer ? issuer : cert.get())) != 1 ||
      X509_set_pubkey(cert.get(), key) != 1) {
    return OpenSslError("cannot fill in the certificate of " + common_name);
  }
  for (const auto& [nid, value] : extensions) {
    AGENTRT_RETURN_IF_ERROR(AddExtension(cert.get(), issuer ? issuer : cert.get(), nid, value));
  }
  if (X509_sign(cert.get(), issuer_key ? issuer_key : key, EVP_sha256()) == 0)
    return OpenSslError("cannot sign the certificate of " + common_name);
  return cert;
}

// `sync` false: the caller makes them durable (SyncFileSystemOf, once for many).
Status WriteKeyAndCertificate(const std::string& key_path, EVP_PKEY* key,
                              const std::string& cert_path, X509* cert, bool sync = true) {
  AGENTRT_ASSIGN_OR_RETURN(const std::string key_pem, Pem(
                                                          [key](BIO* b) {
                                                            return PEM_write_bio_PrivateKey(
                                                                b, key, nullptr, nullptr, 0,
                                                                nullptr, nullptr);
                                                          },
                                                          "cannot write a private key"));
  AGENTRT_ASSIGN_OR_RETURN(
      const std::string cert_pem,
      Pem([cert](BIO* b) { return PEM_write_bio_X509(b, cert); }, "cannot write a certificate"));
  // The key first: a certificate is never found beside a key that is not its own
  // for longer than the second rename.
  const AtomicWriteOptions options{.mode = 0600, .sync_dir = sync, .sync_file = sync};
  AGENTRT_RETURN_IF_ERROR(WriteFileAtomic(key_path, key_pem, options));
  return WriteFileAtomic(cert_path, cert_pem, options);
}

Status EnsureSecretsDir(const RunDir& dir) {
  if (::mkdir(dir.SecretsDir().c_str(), 0700) != 0 && errno != EEXIST)
    return ErrnoStatus(errno, "cannot create " + dir.SecretsDir());
  return Status::Ok();
}

// "agentrt run CA <run folder name>", cut to the 64 characters a common name holds.
std::string CaName(const RunDir& dir) {
  std::string name = "agentrt run CA " + std::filesystem::path(dir.path()).filename().string();
  return name.substr(0, 64);
}

// The run's CA: its certificate and key, read back from secrets/.
struct LoadedCa {
  Owned<X509> cert;
  Owned<EVP_PKEY> key;
};

Result<LoadedCa> LoadRunCa(const RunDir& dir) {
  AGENTRT_ASSIGN_OR_RETURN(const std::string key_pem,
                           ReadPrivateFile(dir.RunCaKeyPath(), "run CA key"));
  AGENTRT_ASSIGN_OR_RETURN(const std::string cert_pem,
                           ReadPrivateFile(dir.RunCaPath(), "run CA certificate"));
  LoadedCa ca;
  Owned<BIO> key_bio(BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size())));
  ca.key.reset(PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
  if (!ca.key) return OpenSslError("cannot read " + dir.RunCaKeyPath());
  Owned<BIO> cert_bio(BIO_new_mem_buf(cert_pem.data(), static_cast<int>(cert_pem.size())));
  ca.cert.reset(PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr));
  if (!ca.cert) return OpenSslError("cannot read " + dir.RunCaPath());
  return ca;
}

}  // namespace

Status EnsureRunCa(const RunDir& dir) {
  AGENTRT_RETURN_IF_ERROR(EnsureSecretsDir(dir));
  auto existing = ReadPrivateFile(dir.RunCaKeyPath(), "run CA key");
  if (!existing.ok() && existing.status().code() != StatusCode::kNotFound) return existing.status();
  if (existing.ok()) {
    const Status cert = ReadPrivateFile(dir.RunCaPath(), "run CA certificate").status();
    // A key without its certificate: the making was cut short before anything
    // could trust it (the certificate is written last), so it is made anew.
    if (cert.code() != StatusCode::kNotFound) return cert;
  }
  AGENTRT_ASSIGN_OR_RETURN(Owned<EVP_PKEY> key, NewKey());
  AGENTRT_ASSIGN_OR_RETURN(Owned<X509> cert,
                           NewCertificate(key.get(), CaName(dir), kCaValidSeconds, nullptr, nullptr,
                                          {{NID_basic_constraints, "critical,CA:TRUE,pathlen:0"},
                                           {NID_key_usage, "critical,keyCertSign,cRLSign"},
                                           {NID_subject_key_identifier, "hash"}}));
  return WriteKeyAndCertificate(dir.RunCaKeyPath(), key.get(), dir.RunCaPath(), cert.get());
}

Status IssueServerCertificate(const RunDir& dir, const std::string& common_name,
                              const std::vector<std::string>& hosts, const std::string& cert_path,
                              const std::string& key_path) {
  AGENTRT_ASSIGN_OR_RETURN(const LoadedCa ca, LoadRunCa(dir));
  std::vector<std::string> names = {"localhost", "127.0.0.1"};
  for (const std::string& h : hosts) {
    if (!h.empty() && std::find(names.begin(), names.end(), h) == names.end()) names.push_back(h);
  }
  std::string alt_names;
  for (const std::string& n : names) {
    unsigned char addr[16];
    const bool ip =
        ::inet_pton(AF_INET, n.c_str(), addr) == 1 || ::inet_pton(AF_INET6, n.c_str(), addr) == 1;
    alt_names += (alt_names.empty() ? "" : ",") + std::string(ip ? "IP:" : "DNS:") + n;
  }
  AGENTRT_ASSIGN_OR_RETURN(Owned<EVP_PKEY> key, NewKey());
  AGENTRT_ASSIGN_OR_RETURN(
      Owned<X509> cert,
      NewCertificate(key.get(), common_name, kServerValidSeconds, ca.cert.get(), ca.key.get(),
                     {{NID_basic_constraints, "critical,CA:FALSE"},
                      {NID_key_usage, "critical,digitalSignature"},
                      {NID_ext_key_usage, "serverAuth"},
                      {NID_subject_alt_name, alt_names},
                      {NID_authority_key_identifier, "keyid:always"}}));
  return WriteKeyAndCertificate(key_path, key.get(), cert_path, cert.get());
}

Status IssueClientCertificates(const RunDir& dir, const std::vector<std::string>& agents) {
  std::vector<std::string> missing;
  for (const std::string& agent : agents) {
    std::error_code ec;
    if (!std::filesystem::exists(dir.ClientCertPath(agent), ec)) missing.push_back(agent);
  }
  if (missing.empty()) return Status::Ok();
  AGENTRT_ASSIGN_OR_RETURN(const LoadedCa ca, LoadRunCa(dir));
  for (const std::string& agent : missing) {
    AGENTRT_ASSIGN_OR_RETURN(Owned<EVP_PKEY> key, NewKey());
    AGENTRT_ASSIGN_OR_RETURN(
        Owned<X509> cert,
        NewCertificate(key.get(), agent, kCaValidSeconds, ca.cert.get(), ca.key.get(),
                       {{NID_basic_constraints, "critical,CA:FALSE"},
                        {NID_key_usage, "critical,digitalSignature"},
                        {NID_ext_key_usage, "clientAuth"},
                        {NID_authority_key_identifier, "keyid:always"}}));
    AGENTRT_RETURN_IF_ERROR(WriteKeyAndCertificate(dir.ClientKeyPath(agent), key.get(),
                                                   dir.ClientCertPath(agent), cert.get(),
                                                   /*sync=*/false));
  }
  return SyncFileSystemOf(dir.SecretsDir());  // once for them all
}

Status PrepareBusTls(const RunDir& dir, BusPlan& bus, bool beyond_loopback,
                     const std::vector<std::string>& clients) {
  BusConfig& tls = bus.settings;
  const bool on = tls.tls == kBusTlsOn || (tls.tls == kBusTlsAuto && beyond_loopback);
  tls.tls = std::string(on ? kBusTlsOn : kBusTlsOff);
  if (!on || (!tls.cert_file.empty() && !bus.run_ca)) return Status::Ok();
  AGENTRT_RETURN_IF_ERROR(EnsureRunCa(dir));
  bus.run_ca = true;
  tls.cert_file = dir.BusCertPath();
  tls.key_file = dir.BusKeyPath();
  tls.ca_file = dir.RunCaPath();
  return tls.mtls ? IssueClientCertificates(dir, clients) : Status::Ok();
}

}  // namespace agentrt
