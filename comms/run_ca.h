// The run's own certificate authority: what `bus.tls` uses when the config
// names no certificate of its own.
//
// Every run that serves its bus over TLS without `cert_file` gets a CA made
// for it alone (RUN_DIR/secrets/ca.pem and ca.key, ECDSA P-256, made once and
// kept for the run's life: a resumed or requeued run, and every agent of an
// older incarnation, still trust it). Whoever serves the bus (the controller,
// or the `agentctl sbatch` bus job on whichever node it lands) has the CA sign
// a fresh broker certificate (secrets/bus.pem and bus.key) for the host names
// and addresses its clients dial, each time it starts. Clients trust exactly
// that CA (AGENTRT_BUS_CA): no certificate from anywhere else passes. Every
// file is 0600 in the 0700 secrets folder; no key ever goes into argv or the
// environment.
//
// Thread-safe (no shared state); blocking file I/O and key generation.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "plan/plan.h"
#include "plan/run_dir.h"

namespace agentrt {

// Makes the run's CA unless it exists (and is readable by its owner only); a
// key left without its certificate (a making cut short) is replaced.
Status EnsureRunCa(const RunDir& dir);

// Signs a fresh server certificate named `common_name` with the run's CA for
// `hosts` (IP addresses become IP names, anything else a DNS name;
// "localhost" and 127.0.0.1 are always added), written with its new key over
// `cert_path` and `key_path` (0600). Needs EnsureRunCa first.
Status IssueServerCertificate(const RunDir& dir, const std::string& common_name,
                              const std::vector<std::string>& hosts, const std::string& cert_path,
                              const std::string& key_path);

// The broker's: secrets/bus.pem and bus.key.
inline Status IssueBusCertificate(const RunDir& dir, const std::vector<std::string>& hosts) {
  return IssueServerCertificate(dir, "agentrt bus", hosts, dir.BusCertPath(), dir.BusKeyPath());
}

// Decides `bus.tls` for this start of the bus (auto: on when it listens
// beyond loopback) and writes the decision, on or off, into `bus`. On without
// a certificate of the user's own (or with the run's CA already): makes the
// run's CA and points the bus at it (run_ca; the broker's certificate is then
// IssueBusCertificate's, by whoever serves). With bus.mtls, every one of
// `clients` (agent names; the league service's too) gets its certificate.
Status PrepareBusTls(const RunDir& dir, BusPlan& bus, bool beyond_loopback,
                     const std::vector<std::string>& clients);

// A client certificate signed by the run's CA for each of `agents` that has
// none yet (RunDir::ClientCertPath and ClientKeyPath, 0600): its common name
// is the agent, the name the broker holds it to (bus.mtls). A certificate
// made for an earlier start stays valid: the CA is the same.
Status IssueClientCertificates(const RunDir& dir, const std::vector<std::string>& agents);

}  // namespace agentrt
