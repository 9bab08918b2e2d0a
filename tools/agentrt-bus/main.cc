// agentrt-bus: the message-bus broker as a standalone program.
//
//   agentrt-bus --plan RUN_DIR/plan.json --secret-file RUN_DIR/bus.secret
//               --port 0 --address-file RUN_DIR/bus.address
//
// Reads the channel ACL from the plan, serves until SIGTERM/SIGINT, then shuts
// down cleanly (exit 0). The bound "host:port" is written atomically to
// --address-file once the broker accepts connections, and removed on exit.
// With --report-file it also keeps a BrokerReport there (plan/records.h: its
// pid, incarnation, recovery notes, counters, topics and subscribers), written
// before the address and then, when it changed, twice a second: how `agentctl run`, which starts
// and supervises the run's broker this way, sees it. Exit status
// kBrokerExitCannotListen (75): the port could not be bound.
//
// Two client subcommands help users look at a running bus:
//   agentrt-bus publish --bus HOST:PORT --token-file F TOPIC PAYLOAD
//   agentrt-bus fetch   --bus HOST:PORT --token-file F TOPIC [--from N] [--max N]
// (fetch prints one JSON object per message: topic, offset, publisher, payload).
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/file_util.h"
#include "comms/auth.h"
#include "comms/bus_client.h"
#include "comms/bus_server.h"
#include "comms/run_ca.h"
#include "plan/fence.h"
#include "plan/records.h"
#include "plan/run_dir.h"

namespace {

// The `bus:` settings that are the broker's storage and limits, each also a
// flag ("--max-message-bytes"): the port, the TLS files and the client's call
// timeout have flags of their own or none.
bool IsStorageSetting(std::string_view name) {
  return name != "port" && name != "call_timeout_s" && name != "tls" && name != "cert_file" &&
         name != "key_file" && name != "ca_file";
}

std::string FlagOf(std::string_view setting) {
  std::string flag = "--" + std::string(setting);
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag;
}

int Fail(const agentrt::Status& s) {
  std::fprintf(stderr, "agentrt-bus: %s\n", s.ToString().c_str());
  return 1;
}

agentrt::Result<std::unique_ptr<agentrt::BusClient>> ClientFor(const std::string& bus,
                                                               const std::string& token_file) {
  if (bus.empty() || token_file.empty()) return agentrt::BusClient::FromEnvironment();
  AGENTRT_ASSIGN_OR_RETURN(agentrt::Credential cred, agentrt::ReadTokenFile(token_file));
  return agentrt::BusClient::Connect(bus, std::move(cred));
}

// The serving flags.
struct ServeFlags {
  std::string plan, secret_file, address_file, advertise_host, log_dir, report_file;
  bool open = false;
  agentrt::BusServerOptions opts;
  agentrt::BusConfig storage;  // the storage flags' values
  std::vector<std::pair<std::string, CLI::Option*>> storage_flags;
  std::map<std::string, std::string> fence_dirs;  // --plan: agent -> its checkpoint fence's folder
};

void AddServeFlags(CLI::App& app, ServeFlags* f) {
  f->opts.host = "0.0.0.0";
  app.add_option("--plan", f->plan, "plan JSON (agents and channels: the ACL)");
  app.add_flag("--open", f->open,
               "no plan: any agent with a valid token may publish/subscribe anything");
  app.add_option("--secret-file", f->secret_file,
                 "run secret (0600 file); agent tokens derive from it");
  app.add_option("--host", f->opts.host, "listen address")->capture_default_str();
  app.add_option("--port", f->opts.port, "listen port (0 = pick a free one)")
      ->capture_default_str();
  app.add_option("--address-file", f->address_file,
                 "write the bound host:port here (atomically) when ready");
  app.add_option("--report-file", f->report_file,
                 "keep a JSON report of the broker here (pid, incarnation, counters, topics, "
                 "subscribers), rewritten when it changes, at most twice a second");
  app.add_option("--advertise-host", f->advertise_host,
                 "host written to --address-file (default: the listen host, or this machine's name "
                 "for 0.0.0.0)");
  // The storage settings as flags, declared by the `bus:` settings list; a
  // flag given wins over the plan's setting. Without --plan: these defaults,
  // but durability memory.
  auto add_storage_flag = [&](const char* name, auto* value, const char* doc) {
    if (!IsStorageSetting(name)) return;
    const std::string_view setting(name);
    // Without --plan the log is off unless asked for: durability memory.
    const std::string fallback = setting == "durability" ? ", else memory" : "";
    CLI::Option* o = app.add_option(
        FlagOf(name), *value,
        std::string(doc) + " (default: with --plan its bus." + name + fallback + ")");
    if (setting != "durability") o->capture_default_str();
    f->storage_flags.emplace_back(name, o);
  };
#define AGENTRT_BUS_FLAG(type, name, default_value, doc) \
  add_storage_flag(#name, &f->storage.name, doc);
  AGENTRT_BUS_SETTINGS(AGENTRT_BUS_FLAG)
#undef AGENTRT_BUS_FLAG
  app.add_option("--log-dir", f->log_dir,
                 "keep the durable log here (default with --plan: RUN_DIR/bus; without: none, "
                 "and durability memory)");
  app.add_option("--tls-cert", f->opts.tls_cert_file, "server certificate (PEM): serve TLS only");
  app.add_option("--tls-key", f->opts.tls_key_file, "server private key (PEM)");
  app.add_option("--tls-client-ca", f->opts.tls_client_ca_file,
                 "CA (PEM) that client certificates must chain to (mTLS)");
}

// The `publish` and `fetch` subcommands' flags.
struct ClientFlags {
  std::string bus, token_file, topic, payload;
  int64_t from = 0;
  int max = 100;
  int timeout_ms = 5000;
  CLI::App* publish = nullptr;
  CLI::App* fetch = nullptr;
};

void AddClientCommands(CLI::App& app, ClientFlags* c) {
  c->publish = app.add_subcommand("publish", "publish one message (as the agent of --token-file)");
  c->fetch = app.add_subcommand("fetch", "print messages of a topic as JSON lines");
  for (auto* sub : {c->publish, c->fetch}) {
    sub->add_option("--bus", c->bus, "broker host:port (default: $AGENTRT_BUS)");
    sub->add_option("--token-file", c->token_file,
                    "agent token file (default: $AGENTRT_TOKEN_FILE)");
    sub->add_option("topic", c->topic, "topic")->required();
    sub->add_option("--timeout-ms", c->timeout_ms, "deadline of the call")->capture_default_str();
  }
  c->publish->add_option("payload", c->payload, "payload bytes")->required();
  c->fetch->add_option("--from", c->from, "first offset")->capture_default_str();
  c->fetch->add_option("--max", c->max, "at most this many messages")->capture_default_str();
}

int RunClient(const ClientFlags& c) {
  auto client = ClientFor(c.bus, c.token_file);
  if (!client.ok()) return Fail(client.status());
  const auto timeout = std::chrono::milliseconds(c.timeout_ms);
  if (*c.publish) {
    agentrt::PublishOptions po;
    po.timeout = timeout;
    auto ack = client.value()->Publish(c.topic, c.payload, po);
    if (!ack.ok()) return Fail(ack.status());
    std::printf("%lld\n", static_cast<long long>(ack->offset));
    return 0;
  }
  auto msgs = client.value()->Fetch(c.topic, c.from, c.max, timeout);
  if (!msgs.ok()) return Fail(msgs.status());
  for (const auto& m : msgs.value()) {
    nlohmann::json j = {{"topic", m.topic()},
                        {"offset", m.offset()},
                        {"publisher", m.publisher()},
                        {"sequence", m.sequence()},
                        {"content_type", m.content_type()},
                        {"payload", m.payload()}};
    // Invalid UTF-8 in a binary payload prints as U+FFFD rather than failing.
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  }
  return 0;
}

// The host written to --address-file.
std::string AdvertisedHost(const ServeFlags& f) {
  if (!f.advertise_host.empty()) return f.advertise_host;
  if (f.opts.host != "0.0.0.0" && f.opts.host != "::") return f.opts.host;
  char name[256] = {};
  return ::gethostname(name, sizeof name - 1) == 0 ? name : "127.0.0.1";
}

// The broker's options and ACL from the plan (as `agentctl run` applies its
// bus settings, with the log in the run dir that holds it) and the flags
// given, which win.
agentrt::Result<agentrt::BusAcl> ResolveServe(ServeFlags& f) {
  if (f.secret_file.empty()) return agentrt::InvalidArgument("--secret-file is required to serve");
  if (f.plan.empty() && !f.open) {
    return agentrt::InvalidArgument("give --plan RUN_DIR/plan.json (the channel ACL), or --open");
  }
  if (!f.opts.tls_cert_file.empty() && f.opts.tls_key_file.empty()) {
    return agentrt::InvalidArgument("--tls-cert needs --tls-key");
  }
  agentrt::BusAcl acl;
  agentrt::BusConfig settings;
  settings.durability = "memory";
  std::string default_log_dir;
  std::map<std::string, std::string>& checkpoint_dirs = f.fence_dirs;
  if (!f.plan.empty()) {
    AGENTRT_ASSIGN_OR_RETURN(agentrt::Plan loaded, agentrt::ReadPlanFile(f.plan));
    acl = agentrt::AclFromPlan(loaded);
    settings = loaded.bus.settings;
    const std::string run_dir = std::filesystem::path(f.plan).parent_path().string();
    const agentrt::RunDir dir(run_dir.empty() ? "." : run_dir);
    default_log_dir = dir.BusLogDir();
    for (const agentrt::AgentPlan& a : loaded.agents)
      checkpoint_dirs[a.name] = dir.Resolve(a.checkpoint_dir);
    // The plan's TLS unless flags name other files; with the run's CA, a
    // certificate signed for this node (the agents trust that CA).
    if (f.opts.tls_cert_file.empty() && settings.tls == agentrt::kBusTlsOn) {
      if (loaded.bus.run_ca) {
        AGENTRT_RETURN_IF_ERROR(agentrt::IssueBusCertificate(dir, {AdvertisedHost(f)}));
      }
      agentrt::SetServerTls(settings, f.opts);
    }
  } else {
    acl.open = true;
  }
  for (const auto& [name, option] : f.storage_flags) {
    if (option->count() == 0) continue;
#define AGENTRT_BUS_GIVEN(type, setting, default_value, doc) \
  if (name == #setting) settings.setting = f.storage.setting;
    AGENTRT_BUS_SETTINGS(AGENTRT_BUS_GIVEN)
#undef AGENTRT_BUS_GIVEN
  }
  auto broker =
      agentrt::BrokerOptionsFor(settings, f.log_dir.empty() ? default_log_dir : f.log_dir);
  if (!broker.ok()) return broker.status().WithContext(f.plan.empty() ? "agentrt-bus" : f.plan);
  f.opts.broker = std::move(broker).value();
  if (!checkpoint_dirs.empty()) {
    // Which launch of an agent is current: the launcher's checkpoint fence
    // says (agentctl's backends and SLURM array tasks write it).
    f.opts.broker.current_launch =
        [dirs = checkpoint_dirs](const std::string& agent) -> agentrt::Result<std::string> {
      const auto it = dirs.find(agent);
      if (it == dirs.end()) return std::string();
      AGENTRT_ASSIGN_OR_RETURN(std::optional<std::string> fence,
                               agentrt::ReadCheckpointFence(it->second));
      return fence.value_or(std::string());
    };
  }
  if (f.opts.broker.durability != agentrt::BusDurability::kMemory &&
      f.opts.broker.log_dir.empty()) {
    return agentrt::InvalidArgument("--durability " +
                                    std::string(BusDurabilityName(f.opts.broker.durability)) +
                                    " needs --log-dir (or --plan: RUN_DIR/bus)");
  }
  return acl;
}

// The --report-file record of `server` now, written unless it is `*last`
// (an idle broker rewrites nothing); not synced (a broker that dies leaves the
// last one whole, and the next broker writes its own).
agentrt::Status WriteReport(const std::string& path, const agentrt::BusServer& server,
                            std::string* last) {
  agentrt::BrokerReport r;
  r.pid = ::getpid();
  r.port = server.port();
  r.incarnation = server.incarnation();
  r.log_sync_errors = server.Stats().log_sync_errors;
  r.recovery_notes = server.recovery_notes();
  r.bus = server.Snapshot();
  r.bus.broker_pid = r.pid;
  std::string text = r.ToJson().dump() + "\n";
  if (text == *last) return agentrt::Status::Ok();
  AGENTRT_RETURN_IF_ERROR(agentrt::WriteFileAtomic(path, text, {0644, false, false}));
  *last = std::move(text);
  return agentrt::Status::Ok();
}

int Serve(ServeFlags& f) {
  auto acl = ResolveServe(f);
  if (!acl.ok()) return Fail(acl.status());
  auto secret = agentrt::ReadSecretFile(f.secret_file);
  if (!secret.ok()) return Fail(secret.status());

  // Signals are taken by sigwait below; block them before gRPC starts threads.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto server = agentrt::BusServer::Start(f.opts, std::move(secret).value(), std::move(*acl));
  if (!server.ok()) {
    Fail(server.status());
    return server.status().code() == agentrt::StatusCode::kUnavailable
               ? agentrt::kBrokerExitCannotListen
               : 1;
  }
  for (const std::string& note : server.value()->recovery_notes())
    std::fprintf(stderr, "agentrt-bus: %s\n", note.c_str());
  // A relaunch's fence, seen as it is written, refuses the launch it replaced
  // at once (without the watcher: at most a second later, Broker::kCurrentKept).
  std::unique_ptr<agentrt::FenceWatcher> fences;
  if (!f.fence_dirs.empty()) {
    agentrt::BusServer* bus = server.value().get();
    auto watching = agentrt::FenceWatcher::Start(
        f.fence_dirs, [bus](const std::string& agent, const std::string& id) {
          bus->SetAgentIncarnation(agent, id);
          std::fprintf(stderr, "agentrt-bus: agent %s: launch %s is current (its fence)\n",
                       agent.c_str(), id.c_str());
        });
    if (watching.ok()) {
      fences = std::move(watching).value();
    } else {
      std::fprintf(stderr, "agentrt-bus: %s; fences are read again at most every second\n",
                   watching.status().ToString().c_str());
    }
  }
  const std::string address = AdvertisedHost(f) + ":" + std::to_string(server.value()->port());
  std::string reported;  // the report's text as last written
  if (!f.report_file.empty()) {
    if (auto s = WriteReport(f.report_file, *server.value(), &reported); !s.ok()) return Fail(s);
  }
  if (!f.address_file.empty()) {
    if (auto s = agentrt::WriteFileAtomic(f.address_file, address + "\n"); !s.ok()) return Fail(s);
  }
  std::fprintf(
      stderr, "agentrt-bus: serving on %s (listen %s:%d, incarnation %016llx, durability %s, %s)\n",
      address.c_str(), f.opts.host.c_str(), server.value()->port(),
      static_cast<unsigned long long>(server.value()->incarnation()),
      std::string(agentrt::BusDurabilityName(f.opts.broker.durability)).c_str(),
      f.opts.tls_cert_file.empty() ? "plaintext"
                                   : (f.opts.tls_client_ca_file.empty() ? "TLS" : "mutual TLS"));

  int sig = 0;
  if (f.report_file.empty()) {
    sigwait(&signals, &sig);
  } else {
    // A report that cannot be written (a full disk) is said once, not twice a second.
    const timespec half_a_second{0, 500'000'000};
    bool failing = false;
    while ((sig = sigtimedwait(&signals, nullptr, &half_a_second)) < 0) {
      const agentrt::Status s = WriteReport(f.report_file, *server.value(), &reported);
      if (!s.ok() && !failing) std::fprintf(stderr, "agentrt-bus: %s\n", s.ToString().c_str());
      failing = !s.ok();
    }
  }
  std::fprintf(stderr, "agentrt-bus: %s received, shutting down\n",
               sig == SIGTERM ? "SIGTERM" : "SIGINT");
  fences.reset();
  server.value()->Shutdown();
  if (!f.address_file.empty()) ::unlink(f.address_file.c_str());
  if (!f.report_file.empty()) WriteReport(f.report_file, *server.value(), &reported).IgnoreError();
  const agentrt::BusStats st = server.value()->Stats();
  std::fprintf(
      stderr,
      "agentrt-bus: stopped (published %lld, duplicates %lld, delivered %lld, expired %lld)\n",
      static_cast<long long>(st.messages_published), static_cast<long long>(st.duplicates_dropped),
      static_cast<long long>(st.messages_delivered), static_cast<long long>(st.messages_expired));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"agentrt-bus: the agentrt message-bus broker (gRPC, comms/proto/bus.proto)"};
  ServeFlags serve;
  AddServeFlags(app, &serve);
  ClientFlags client;
  AddClientCommands(app, &client);
  CLI11_PARSE(app, argc, argv);
  if (*client.publish || *client.fetch) return RunClient(client);
  return Serve(serve);
}
