#include <fmt/format.h>
#include <sys/resource.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include "comms/auth.h"
#include "plan/config.h"
#include "plan/plan.h"
#include "scheduler/loader.h"
#include "tests/common/temp_dir.h"

namespace agentrt {
namespace {

using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using testing::TempDir;

// Loads `text` as the file `name` and returns the error message ("" when it loaded).
std::string ErrorOf(const std::string& text, const std::string& name = "agents.yaml") {
  Result<Config> c = LoadConfigString(text, name);
  return c.ok() ? std::string() : c.status().message();
}

long PeakRssKb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss;
}

template <typename F>
double SecondsOf(F&& f) {
  auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

const char* kFull = R"(run: {name: predator-prey, dir: runs}
cluster:
  nodes:
    - {name: "node[01-04]", gpus: 8, cpus: 64, nvlink_domains: [[0,1,2,3],[4,5,6,7]]}
    - {name: cpu1, cpus: 16}
  ports: {first: 20000, last: 29999, per_agent: 16}
slurm: {partition: gpu, account: rl, time: "24:00:00", signal_grace_s: 120}
bus: {port: auto, max_message_bytes: 4194304, retention: 100000, tls: false}
defaults:
  restart: {max_restarts: 3, backoff_s: 2}
  checkpoint: {interval_s: 1800, keep_last: 3}
  env: {PYTHONUNBUFFERED: "1", OMP_NUM_THREADS: 4}
agents:
  - name: predator
    replicas: 2
    gpus: 2
    command: [agent-worker]
    env: {OMP_NUM_THREADS: "2"}
    args: {env: predator_prey, algo: ppo, lr: 0.0003, steps: 200000, tags: [a, "b"], on: true, none: ~, ver: "1"}
    restart: {max_restarts: 5}
  - name: prey
    replicas: 3
    gpus: 0
    ranks: 2
    nodes: [cpu1]
    backend: mpi
  - name: judge
channels:
  - {topic: sightings, publishers: ["predator-*"], subscribers: ["predator-*", "prey-*"]}
  - {topic: "weights/{agent}", publishers: ["*"], subscribers: [judge]}
)";

TEST_CASE("loader reads the full config schema and expands replicas, defaults and channels") {
  Result<Config> loaded = LoadConfigString(kFull, "full.yaml");
  REQUIRE(loaded.ok());
  const Config& c = *loaded;
  CHECK(c.source == "full.yaml");
  CHECK(c.run.name == "predator-prey");
  REQUIRE(c.cluster.nodes.size() == 5);
  CHECK(c.cluster.nodes[0].name == "node01");
  CHECK(c.cluster.nodes[3].name == "node04");
  CHECK(c.cluster.nodes[3].nvlink_domains ==
        std::vector<std::vector<int>>{{0, 1, 2, 3}, {4, 5, 6, 7}});
  CHECK(c.cluster.nodes[4].name == "cpu1");
  CHECK(c.cluster.nodes[4].gpus == 0);
  CHECK(c.cluster.nodes[4].cpus == 16);
  CHECK(c.slurm.partition == "gpu");
  CHECK(c.slurm.signal_grace_s == 120);
  CHECK(c.bus.port == 0);
  CHECK(c.bus.max_message_bytes == 4194304);
  CHECK(c.bus.tls == "off");  // YAML's false

  REQUIRE(c.agents.size() == 6);
  const char* names[] = {"predator-0", "predator-1", "prey-0", "prey-1", "prey-2", "judge"};
  for (size_t i = 0; i < 6; ++i) {
    CHECK(c.agents[i].name == names[i]);
    CHECK(c.agents[i].index == static_cast<int>(i));
  }
  const AgentConfig& p1 = c.agents[1];
  CHECK(p1.base_name == "predator");
  CHECK(p1.replica == 1);
  CHECK(p1.gpus == 2);
  CHECK(p1.ranks == 2);  // one rank per GPU
  CHECK(p1.line == 14);
  CHECK(p1.restart.max_restarts == 5);            // own override
  CHECK(p1.restart.backoff_s == 2.0);             // inherited
  CHECK(p1.restart.heartbeat_timeout_s == 60.0);  // built-in default
  CHECK(p1.checkpoint.keep_last == 3);
  CHECK(p1.checkpoint.snapshot == "copy");  // the built-in default
  CHECK(p1.env.at("PYTHONUNBUFFERED") == "1");
  CHECK(p1.env.at("OMP_NUM_THREADS") == "2");  // agent env wins over defaults.env
  CHECK(p1.args["lr"].is_number_float());
  CHECK(p1.args["steps"] == 200000);
  CHECK(p1.args["tags"] == nlohmann::json::array({"a", "b"}));
  CHECK(p1.args["on"] == true);
  CHECK(p1.args["none"].is_null());
  CHECK(p1.args["ver"] == "1");  // quoted stays a string
  const AgentConfig& prey = c.agents[2];
  CHECK(prey.ranks == 2);
  CHECK(prey.gpus == 0);
  CHECK(prey.nodes == std::vector<std::string>{"cpu1"});
  CHECK(prey.backend == GroupBackend::kMpi);
  CHECK(prey.command == std::vector<std::string>{"agent-worker"});
  CHECK(c.agents[5].name == "judge");  // no replicas: key → no suffix
  CHECK(c.agents[5].ranks == 1);

  REQUIRE(c.channels.size() == 1 + 6);
  CHECK(c.channels[0].topic == "sightings");
  CHECK(c.channels[0].publishers == std::vector<std::string>{"predator-0", "predator-1"});
  CHECK(c.channels[0].subscribers ==
        std::vector<std::string>{"predator-0", "predator-1", "prey-0", "prey-1", "prey-2"});
  CHECK(c.channels[1].topic == "weights/predator-0");
  CHECK(c.channels[1].publishers == std::vector<std::string>{"predator-0"});
  CHECK(c.channels[1].subscribers == std::vector<std::string>{"judge"});
  CHECK(c.channels[6].topic == "weights/judge");
  CHECK(c.TotalGpus() == 4);
  CHECK(c.TotalRanks() == 2 + 2 + 6 + 1);
}

TEST_CASE("restart.elastic: {min_ranks: K} is read, inherited and checked against the ranks") {
  auto c = LoadConfigString(
      "defaults: {restart: {elastic: {min_ranks: 1}}}\n"
      "agents:\n  - {name: wide, ranks: 4, restart: {elastic: {min_ranks: 2}}}\n  - {name: b}\n",
      "agents.yaml");
  REQUIRE(c.ok());
  CHECK(c->agents[0].restart.elastic_min_ranks == 2);
  CHECK(c->agents[1].restart.elastic_min_ranks == 1);
  CHECK_THAT(ErrorOf("agents:\n  - {name: a, ranks: 2, restart: {elastic: {min_ranks: 3}}}\n"),
             Contains("key 'agents[0].restart.elastic.min_ranks': expected at most the agent's 2 "
                      "ranks, got 3"));
  CHECK_THAT(ErrorOf("agents:\n  - {name: a, ranks: 2, restart: {elastic: {min_ranks: 0}}}\n"),
             Contains("key 'agents[0].restart.elastic.min_ranks': expected a positive count"));
  CHECK_THAT(ErrorOf("agents:\n  - {name: a, ranks: 2, restart: {elastic: {min: 1}}}\n"),
             Contains("agents[0].restart.elastic"));
}

TEST_CASE("loader fills in defaults for a minimal config") {
  Result<Config> c = LoadConfigString("agents: [{name: solo}]\n");
  REQUIRE(c.ok());
  CHECK(c->run.name == "agentrt");
  CHECK(c->cluster.nodes.empty());
  CHECK(c->cluster.ports.first == 20000);
  CHECK(c->cluster.ports.per_agent == 16);
  CHECK(c->agents[0].command == std::vector<std::string>{"agent-worker"});
  CHECK(c->agents[0].checkpoint.interval_s == 1800.0);
  CHECK(c->agents[0].args.is_object());
}

TEST_CASE("an unknown key names file:line:column, the key, and a did-you-mean") {
  std::string e = ErrorOf("agents:\n  - name: a\n    gpu: 2\n");
  CHECK_THAT(e, StartsWith("agents.yaml:3:5: key 'agents[0].gpu': unknown key"));
  CHECK_THAT(e, Contains("did you mean 'gpus'?"));
  e = ErrorOf("agnets:\n  - name: a\n");
  CHECK_THAT(e, StartsWith("agents.yaml:1:1: key 'agnets'"));
  CHECK_THAT(e, Contains("did you mean 'agents'?"));
  e = ErrorOf("bus: {prot: 5000}\nagents: [{name: a}]\n");
  CHECK_THAT(e, Contains("key 'bus.prot'"));
  CHECK_THAT(e, Contains("did you mean 'port'?"));
  // Nothing close: no suggestion.
  CHECK_THAT(ErrorOf("agents: [{name: a, zzzzzzzz: 1}]\n"), !Contains("did you mean"));
}

TEST_CASE("a wrong type says what was expected") {
  CHECK_THAT(ErrorOf("agents:\n  - name: a\n    gpus: two\n"),
             StartsWith("agents.yaml:3:11: key 'agents[0].gpus': expected an integer, got 'two'"));
  CHECK_THAT(ErrorOf("agents: {name: a}\n"),
             Contains("key 'agents': expected a non-empty list of agents"));
  CHECK_THAT(ErrorOf("agents: [{name: a, args: [1, 2]}]\n"),
             Contains("key 'agents[0].args': expected a map"));
  CHECK_THAT(ErrorOf("bus: {tls: maybe}\nagents: [{name: a}]\n"),
             Contains("key 'bus.tls': expected on, off or auto (true and false are on and off), "
                      "got 'maybe'"));
  CHECK_THAT(ErrorOf("bus: {key_file: bus.key}\nagents: [{name: a}]\n"),
             Contains("expected cert_file and key_file together (or neither: the run makes its "
                      "own CA)"));
  CHECK_THAT(ErrorOf("bus: {ca_file: ca.pem}\nagents: [{name: a}]\n"),
             Contains("key 'bus.ca_file': ca_file belongs to your own cert_file"));
  // TLS files are taken from the config's folder, and must be there.
  const std::string missing = ErrorOf(
      "bus: {tls: true, cert_file: no-such.pem, key_file: no-such.key}\nagents: [{name: a}]\n");
  CHECK_THAT(missing, Contains("bus.cert_file") && Contains("no such file") &&
                          Contains("no-such.pem (relative paths are taken from the folder"));
  CHECK_THAT(ErrorOf("agents: [{name: a, gpus: \"2\"}]\n"), Contains("expected an integer"));
  CHECK_THAT(ErrorOf("agents: [{name: a, backend: ncl}]\n"), Contains("did you mean 'nccl'?"));
  CHECK_THAT(ErrorOf("bus: {port: 70000}\nagents: [{name: a}]\n"),
             Contains("key 'bus.port': expected auto or a port"));
  CHECK_THAT(ErrorOf("slurm: {steps: nodes}\nagents: [{name: a}]\n"),
             StartsWith("agents.yaml:1:16: key 'slurm.steps': expected agent (a job step per "
                        "agent) or node (one step per node for its single-node agents), got "
                        "'nodes'"));
}

TEST_CASE("negative or zero counts are rejected") {
  CHECK_THAT(ErrorOf("agents: [{name: a, gpus: -1}]\n"),
             Contains("key 'agents[0].gpus': expected 0 (a CPU agent) or more GPUs, got -1"));
  CHECK_THAT(ErrorOf("agents: [{name: a, replicas: 0}]\n"),
             Contains("key 'agents[0].replicas': expected at least 1, got 0"));
  CHECK_THAT(ErrorOf("agents: [{name: a, ranks: 0}]\n"),
             Contains("key 'agents[0].ranks': expected at least 1 rank, got 0"));
  CHECK_THAT(ErrorOf("agents: [{name: a, gpus: 2, ranks: 3}]\n"),
             Contains("expected a multiple of gpus (2)"));
  CHECK_THAT(ErrorOf("cluster: {nodes: [{name: n1, cpus: 0}]}\nagents: [{name: a}]\n"),
             Contains("key 'cluster.nodes[0].cpus': expected at least 1 CPU, got 0"));
  CHECK_THAT(ErrorOf("defaults: {checkpoint: {keep_last: 0}}\nagents: [{name: a}]\n"),
             Contains("key 'defaults.checkpoint.keep_last': expected at least 1"));
  CHECK_THAT(
      ErrorOf("agents: [{name: a, checkpoint: {snapshot: cow}}]\n"),
      Contains(":1:43: key 'agents[0].checkpoint.snapshot': expected copy or fork, got 'cow'"));
  CHECK_THAT(ErrorOf("defaults: {restart: {max_restarts: -2}}\nagents: [{name: a}]\n"),
             Contains("key 'defaults.restart.max_restarts'"));
  CHECK_THAT(ErrorOf("bus: {retention: 0}\nagents: [{name: a}]\n"),
             Contains("key 'bus.retention': expected a positive count"));
  CHECK_THAT(ErrorOf("bus: {max_message_bytes: 2147483648}\nagents: [{name: a}]\n"),
             Contains("agents.yaml:1:26: key 'bus.max_message_bytes': 2147483648 is above the "
                      "largest message the bus carries, 1073741824 (1 GiB)"));
}

TEST_CASE("duplicate agent names after replica expansion are rejected") {
  std::string e = ErrorOf("agents:\n  - name: a\n    replicas: 2\n  - name: a-1\n");
  CHECK_THAT(e, StartsWith("agents.yaml:4:11: key 'agents[1].name': agent name 'a-1' is already "
                           "used by the agent at agents.yaml:2:5"));
  CHECK_THAT(ErrorOf("agents: [{name: b}, {name: b}]\n"),
             Contains("agent name 'b' is already used"));
}

TEST_CASE("a channel pattern matching no agent is rejected with a suggestion") {
  std::string e = ErrorOf(
      "agents: [{name: predator, replicas: 2}]\nchannels:\n  - {topic: t, publishers: "
      "[\"predatr-*\"], subscribers: [\"*\"]}\n");
  CHECK_THAT(e, StartsWith("agents.yaml:3:29: key 'channels[0].publishers[0]': pattern 'predatr-*' "
                           "matches no agent"));
  CHECK_THAT(e, Contains("did you mean 'predator-*'?"));
  CHECK_THAT(ErrorOf("agents: [{name: a}]\nchannels: [{topic: t, publishers: [a]}]\n"),
             Contains("key 'channels[0].subscribers': missing"));
  CHECK_THAT(ErrorOf("agents: [{name: a}]\nchannels: [{topic: t, publishers: [a], subscribers: "
                     "[a]}, {topic: t, publishers: [a], subscribers: [a]}]\n"),
             Contains("topic 't' is already declared by channels[0]"));
}

TEST_CASE("a channel's keep_last reaches plan.json and the bus ACL; below 1 is refused") {
  Result<Config> c = LoadConfigString(
      "agents: [{name: a, replicas: 2}]\nchannels:\n  - {topic: \"weights/{agent}\", "
      "publishers: [\"a-*\"], subscribers: [\"*\"], keep_last: 3}\n",
      "agents.yaml");
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  REQUIRE(c->channels.size() == 2);
  CHECK(c->channels[1].topic == "weights/a-1");
  CHECK(c->channels[1].keep_last == 3);
  Plan plan;
  plan.run = "r";
  plan.channels.push_back({"weights/a-1", {"a-1"}, {"a-0", "a-1"}, 3});
  plan.channels.push_back({"results", {"a-0"}, {"a-1"}});
  Result<Plan> back = PlanFromJson(nlohmann::json::parse(PlanToJsonString(plan)));
  REQUIRE(back.ok());
  REQUIRE(back->channels.size() == 2);
  CHECK(back->channels[0].keep_last == 3);
  CHECK(back->channels[1].keep_last == 0);
  const BusAcl acl = AclFromPlan(*back);
  CHECK(acl.KeepLast("weights/a-1") == 3);
  CHECK(acl.KeepLast("results") == 0);
  CHECK_THAT(ErrorOf("agents: [{name: a}]\nchannels:\n  - {topic: t, publishers: [a], "
                     "subscribers: [a], keep_last: 0}\n"),
             StartsWith("agents.yaml:3:62: key 'channels[0].keep_last': expected at least 1"));
}

TEST_CASE("a port range too small for the bus and one agent is rejected") {
  std::string e = ErrorOf(
      "cluster:\n  ports: {first: 20000, last: 20010, per_agent: 16}\nagents: [{name: a}]\n");
  CHECK_THAT(e, StartsWith("agents.yaml:2:10: key 'cluster.ports': port range too small: "
                           "20000-20010 holds 0 block(s) of 16 ports"));
  CHECK_THAT(ErrorOf("cluster: {ports: {first: 30000, last: 20000}}\nagents: [{name: a}]\n"),
             Contains("expected first <= last"));
  CHECK_THAT(ErrorOf("cluster: {ports: {first: 0}}\nagents: [{name: a}]\n"),
             Contains("key 'cluster.ports.first': expected a port in 1..65535"));
}

TEST_CASE("a malformed hostlist is rejected at its position") {
  CHECK_THAT(
      ErrorOf("cluster:\n  nodes:\n    - {name: \"gpu[01-\", gpus: 8}\nagents: [{name: a}]\n"),
      StartsWith("agents.yaml:3:14: key 'cluster.nodes[0].name': malformed hostlist 'gpu[01-' at "
                 "character 4: '[' without ']'"));
  CHECK_THAT(ErrorOf("cluster: {nodes: [{name: \"n[3-1]\"}]}\nagents: [{name: a}]\n"),
             Contains("runs backwards"));
  CHECK_THAT(ErrorOf("cluster: {nodes: [{name: \"n[1-2],n2\"}]}\nagents: [{name: a}]\n"),
             Contains("node 'n2' is listed twice"));
  CHECK_THAT(ErrorOf("agents: [{name: a, nodes: \"x[a-b]\"}]\n"), Contains("malformed hostlist"));
}

TEST_CASE("NVLink domains must partition the node's GPUs") {
  CHECK_THAT(ErrorOf("cluster: {nodes: [{name: n, gpus: 4, nvlink_domains: "
                     "[[0,1],[1,2,3]]}]}\nagents: [{name: a}]\n"),
             Contains("GPU 1 is already in domain 0"));
  CHECK_THAT(ErrorOf("cluster: {nodes: [{name: n, gpus: 4, nvlink_domains: [[0,1],[2]]}]}\nagents: "
                     "[{name: a}]\n"),
             Contains("GPU 3 is in no domain"));
  CHECK_THAT(
      ErrorOf(
          "cluster: {nodes: [{name: n, gpus: 4, nvlink_domains: [[0,4]]}]}\nagents: [{name: a}]\n"),
      Contains("expected a GPU id in 0..3, got 4"));
  Result<Config> c =
      LoadConfigString("cluster: {nodes: [{name: n, gpus: 4}]}\nagents: [{name: a}]\n");
  REQUIRE(c.ok());
  CHECK(c->cluster.nodes[0].nvlink_domains == std::vector<std::vector<int>>{{0, 1, 2, 3}});
}

TEST_CASE("an empty file, a non-YAML file and a non-map document are rejected clearly") {
  CHECK(ErrorOf("") ==
        "agents.yaml:1:1: the config is empty; expected a map with at least an 'agents:' list");
  CHECK(ErrorOf("# only a comment\n") ==
        "agents.yaml:1:1: the config is empty; expected a map with at least an 'agents:' list");
  CHECK_THAT(ErrorOf("this is: [not yaml\n"), StartsWith("agents.yaml:2:1: not valid YAML"));
  CHECK_THAT(
      ErrorOf("hello world\n"),
      Contains("expected a map with at least an 'agents:' list at the top, got 'hello world'"));
  std::string binary(
      "\x7f"
      "ELF\x02\x01\x01\x00\x00",
      9);
  CHECK_THAT(ErrorOf(binary), Contains("is not allowed in YAML; is this a text file?"));
  CHECK_THAT(ErrorOf("run: {name: x}\n"), Contains("key 'agents': missing"));
}

TEST_CASE("a billion-laughs alias bomb is rejected quickly with bounded memory") {
  std::string bomb =
      "lol: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n";
  const char letters[] = "abcdefghij";
  for (int i = 1; i < 10; ++i) {
    bomb += fmt::format("l{}: &{} [", i, letters[i]);
    for (int k = 0; k < 9; ++k) bomb += fmt::format("{}*{}", k ? "," : "", letters[i - 1]);
    bomb += "]\n";
  }
  std::string e;
  double s = SecondsOf([&] { e = ErrorOf(bomb); });
  CHECK_THAT(e, Contains("aliases (*); refusing a possible alias bomb"));
  CHECK(s < 2.0);

  // Fewer aliases than the pre-scan allows, but still 10^6 nodes once expanded:
  // the conversion's node budget stops it.
  std::string quiet = "agents:\n  - name: a\n    args:\n      x0: &a0 [l,l,l,l,l,l,l,l,l,l]\n";
  for (int i = 1; i < 7; ++i) {
    quiet += fmt::format("      x{}: &a{} [", i, i);
    for (int k = 0; k < 10; ++k) quiet += fmt::format("{}*a{}", k ? "," : "", i - 1);
    quiet += "]\n";
  }
  const long rss_before = PeakRssKb();
  s = SecondsOf([&] { e = ErrorOf(quiet); });
  CHECK_THAT(e, Contains("expands to more than"));
  CHECK(s < 5.0);
  CHECK(PeakRssKb() - rss_before < 256 * 1024);  // well under 256 MiB of growth
}

TEST_CASE("10,000-deep nesting is rejected before yaml-cpp recurses") {
  std::string flow = "agents: " + std::string(10000, '[') + std::string(10000, ']') + "\n";
  std::string e;
  double s = SecondsOf([&] { e = ErrorOf(flow); });
  CHECK_THAT(e, Contains("nesting deeper than 64 levels"));
  CHECK(s < 2.0);
  std::string maps = "agents: ";
  for (int i = 0; i < 10000; ++i) maps += "{a: ";
  maps += "1" + std::string(10000, '}') + "\n";
  CHECK_THAT(ErrorOf(maps), Contains("nesting deeper than 64 levels"));
  std::string block = "agents:\n";
  for (int i = 0; i < 10000; ++i) block += "- ";
  block += "x\n";
  CHECK_THAT(ErrorOf(block), StartsWith("agents.yaml:2:1: nesting deeper than 64 levels"));
  std::string indented;
  for (int i = 0; i < 100; ++i) indented += std::string(static_cast<size_t>(i), ' ') + "k:\n";
  CHECK_THAT(ErrorOf(indented), Contains("nesting deeper than 64 levels"));
  // Brackets inside quotes and plain scalars do not count.
  CHECK(ErrorOf("agents:\n  - name: a\n    args:\n      s: \"" + std::string(100, '[') +
                "\"\n      h: x[1-2]\n")
            .empty());
}

TEST_CASE("a 50 MB file is rejected by the size cap without being read") {
  TempDir dir;
  const std::string path = dir.Path("huge.yaml");
  { std::ofstream(path) << "agents: [{name: a}]\n"; }
  std::filesystem::resize_file(path, 50u * 1024 * 1024);
  Result<Config> c = LoadConfigFile(path);
  double s = SecondsOf([&] { c = LoadConfigFile(path); });
  REQUIRE_FALSE(c.ok());
  CHECK_THAT(c.status().message(),
             Contains("file is 52428800 bytes; the limit for a config is 1048576 bytes"));
  CHECK(s < 1.0);
  std::string big(2u * 1024 * 1024, ' ');
  CHECK_THAT(ErrorOf(big), Contains("the limit for a config is"));
  CHECK_THAT(LoadConfigFile(dir.Path("missing.yaml")).status().message(),
             Contains("cannot read config"));
}

TEST_CASE("the launcher's own environment variables cannot be overridden") {
  CHECK_THAT(ErrorOf("agents: [{name: a, env: {CUDA_VISIBLE_DEVICES: \"0\"}}]\n"),
             Contains("is set by agentrt for every rank"));
  CHECK_THAT(ErrorOf("agents: [{name: a, env: {AGENTRT_RUN_DIR: x}}]\n"),
             Contains("key 'agents[0].env.AGENTRT_RUN_DIR'"));
  CHECK_THAT(ErrorOf("agents: [{name: a, env: {\"1BAD\": x}}]\n"),
             Contains("expected an environment variable name"));
}

TEST_CASE("command-line overrides are applied before validation") {
  LoadOptions options;
  options.overrides = {"bus.port=21000", "run.name=override", "defaults.restart.max_restarts=0",
                       "cluster.ports={first: 30000, last: 30999}"};
  Result<Config> c = LoadConfigString("agents: [{name: a}]\n", "o.yaml", options);
  REQUIRE(c.ok());
  CHECK(c->bus.port == 21000);
  CHECK(c->run.name == "override");
  CHECK(c->agents[0].restart.max_restarts == 0);
  CHECK(c->cluster.ports.first == 30000);
  options.overrides = {"bus.port=nope"};
  CHECK_THAT(LoadConfigString("agents: [{name: a}]\n", "o.yaml", options).status().message(),
             StartsWith("--set bus.port=nope: key 'bus.port': expected an integer, got 'nope'"));
  options.overrides = {"agents=[{name:x}]"};  // YAML reads `name:x` as one key
  CHECK_THAT(LoadConfigString("agents: [{name: a}]\n", "o.yaml", options).status().message(),
             StartsWith("--set agents=[{name:x}]: key 'agents[0].name:x': unknown key"));
  options.overrides = {"run.name=" + std::string(100, '[')};
  CHECK_THAT(LoadConfigString("agents: [{name: a}]\n", "o.yaml", options).status().message(),
             Contains("nesting deeper than 64 levels"));
  options.overrides = {"justakey"};
  CHECK_THAT(LoadConfigString("agents: [{name: a}]\n", "o.yaml", options).status().message(),
             Contains("expected key.path=value"));
}

TEST_CASE("an inventory file replaces the config's nodes and, when given, its ports") {
  TempDir dir;
  Result<Config> c = LoadConfigString(kFull, "full.yaml");
  REQUIRE(c.ok());
  std::string inv =
      dir.Write("inv.yaml", "cluster:\n  nodes:\n    - {name: \"big[1-2]\", gpus: 4, cpus: 8}\n");
  REQUIRE(ApplyClusterFile(inv, *c).ok());
  REQUIRE(c->cluster.nodes.size() == 2);
  CHECK(c->cluster.nodes[1].name == "big2");
  CHECK(c->cluster.ports.first == 20000);
  inv = dir.Write(
      "inv2.yaml",
      "cluster:\n  nodes: [{name: x}]\n  ports: {first: 40000, last: 40999, per_agent: 8}\n");
  REQUIRE(ApplyClusterFile(inv, *c).ok());
  CHECK(c->cluster.ports.first == 40000);
  CHECK(c->cluster.ports.per_agent == 8);
  inv = dir.Write("bad.yaml", "cluster:\n  nodez: []\n");
  CHECK_THAT(ApplyClusterFile(inv, *c).message(), Contains("bad.yaml:2:3: key 'cluster.nodez'"));
  inv = dir.Write("empty.yaml", "");
  CHECK_THAT(ApplyClusterFile(inv, *c).message(), Contains("the inventory is empty"));
}

TEST_CASE("a second YAML document is an error at its line") {
  const std::string e = ErrorOf("agents:\n  - name: a\n---\nagents: 5\n");
  CHECK_THAT(e, StartsWith("agents.yaml:4:1: a second YAML document"));
  CHECK(ErrorOf("agents:\n  - name: a\n---\n").empty());  // an empty trailing document is none
}

TEST_CASE("a channel topic may be a glob; other punctuation is refused") {
  Result<Config> c = LoadConfigString(
      "agents: [{name: a}, {name: b}]\n"
      "channels: [{topic: \"probe/*\", publishers: [a], subscribers: [\"*\"]}]\n");
  REQUIRE(c.ok());
  REQUIRE(c->channels.size() == 1);
  CHECK(c->channels[0].topic == "probe/*");
  CHECK_THAT(ErrorOf("agents: [{name: a}]\n"
                     "channels: [{topic: \"probe?\", publishers: [a], subscribers: [a]}]\n"),
             Contains("agents.yaml:2:20: key 'channels[0].topic'"));
}

TEST_CASE("relative program and script paths are taken from the config's folder") {
  TempDir dir;
  dir.Write("train.py", "print('hi')\n");
  std::filesystem::create_directories(dir.Path("bin"));
  dir.Write("bin/agent", "#!/bin/sh\n");
  const std::string config =
      dir.Write("agents.yaml",
                "agents:\n"
                "  - {name: a, command: [python3, -u, train.py, --lr, \"0.1\"]}\n"
                "  - {name: b, command: [bin/agent, -c, \"print(1)\"], workdir: scratch/b}\n"
                "  - {name: c, command: [/bin/true], workdir: /tmp/c-dir}\n");
  Result<Config> c = LoadConfigFile(config);
  REQUIRE(c.ok());
  const std::filesystem::path base = std::filesystem::path(config).parent_path();
  CHECK(c->agents[0].command ==
        std::vector<std::string>{"python3", "-u", (base / "train.py").string(), "--lr", "0.1"});
  CHECK(c->agents[0].workdir.empty());  // RUN_DIR/agents/a, decided by the plan
  CHECK(c->agents[1].command[0] == (base / "bin/agent").string());
  CHECK(c->agents[1].command[2] == "print(1)");  // an inline program is not a path
  CHECK(c->agents[1].workdir == (base / "scratch/b").string());
  CHECK(c->agents[2].workdir == "/tmp/c-dir");

  const std::string missing =
      dir.Write("missing.yaml", "agents:\n  - name: a\n    command: [python3, tran.py]\n");
  Result<Config> m = LoadConfigFile(missing);
  REQUIRE_FALSE(m.ok());
  CHECK_THAT(m.status().message(), StartsWith(missing + ":3:24: key 'agents[0].command[1]'"));
  CHECK_THAT(m.status().message(), Contains("no such file " + (base / "tran.py").string()));
  CHECK_THAT(ErrorOf("agents: [{name: a, workdir: \"\"}]\n"),
             Contains("key 'agents[0].workdir': expected a directory"));
}

TEST_CASE("a program's own args validator fails the load at the key's line:column") {
  LoadOptions options;
  options.args_validators["trainer"] =
      [](const nlohmann::json& args) -> std::optional<ArgsProblem> {
    if (args.contains("lr") && !args["lr"].is_number())
      return ArgsProblem{"lr", "expected a number"};
    if (args.contains("oops")) return ArgsProblem{"", "the args as a whole are wrong"};
    return std::nullopt;
  };
  const char* ok = "agents:\n  - name: a\n    command: [/opt/x/trainer]\n    args: {lr: 0.1}\n";
  CHECK(LoadConfigString(ok, "agents.yaml", options).ok());
  Result<Config> bad = LoadConfigString(
      "agents:\n  - name: a\n    command: [/opt/x/trainer]\n    args:\n      steps: 5\n"
      "      lr: fast\n",
      "agents.yaml", options);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message() == "agents.yaml:6:7: key 'agents[0].args.lr': expected a number");
  Result<Config> whole =
      LoadConfigString("agents:\n  - name: a\n    command: [/opt/x/trainer]\n    args: {oops: 1}\n",
                       "agents.yaml", options);
  REQUIRE_FALSE(whole.ok());
  CHECK_THAT(whole.status().message(),
             StartsWith("agents.yaml:4:11: key 'agents[0].args': the args as a whole"));
  // Another program's args are its own business.
  CHECK(LoadConfigString("agents:\n  - {name: a, command: [/bin/other], args: {lr: fast}}\n",
                         "agents.yaml", options)
            .ok());
}

TEST_CASE("every setting is listed with its type, default and doc") {
  std::string s = DescribeSettings();
  for (const char* key :
       {"run.name", "cluster.ports.per_agent", "slurm.signal_grace_s", "bus.max_message_bytes",
        "bus.retention_bytes", "bus.ca_file", "defaults.restart.heartbeat_timeout_s",
        "defaults.checkpoint.keep_last", "agents[].replicas", "channels[].topic"}) {
    CHECK_THAT(s, Contains(key));
  }
  CHECK_THAT(s, Contains("heartbeat_timeout_s float   60"));
}

TEST_CASE("validate --settings lists every key the loader accepts") {
  const std::string s = "\n" + DescribeSettings();
  const std::vector<std::string> keys = AcceptedSettingKeys();
  CHECK(keys.size() > 50);
  for (const std::string& key : keys) {
    INFO(key);
    CHECK_THAT(s, Contains("\n" + key + " "));
  }
}

TEST_CASE("ClosestMatch suggests only plausible typos") {
  CHECK(ClosestMatch("replica", {"name", "replicas", "gpus"}) == "replicas");
  CHECK(ClosestMatch("xyz", {"name", "replicas", "gpus"}).empty());
}

}  // namespace
}  // namespace agentrt

namespace agentrt {
namespace {

TEST_CASE("one rule decides the backend: two ranks on one GPU under NCCL are refused") {
  // auto on a GPU agent is nccl, which refuses two ranks on one GPU.
  std::string e = ErrorOf("agents:\n  - name: crowded\n    gpus: 1\n    ranks: 2\n");
  CHECK_THAT(e, StartsWith("agents.yaml:4:12: key 'agents[0].ranks':"));
  CHECK_THAT(e, Contains("puts 2 ranks on 1 GPU(s)") && Contains("Duplicate GPU detected") &&
                    Contains("backend: mpi"));
  // ...and so does an explicit nccl.
  CHECK_THAT(ErrorOf("agents: [{name: a, gpus: 2, ranks: 4, backend: nccl}]\n"),
             Contains("key 'agents[0].backend': backend nccl puts 4 ranks on 2 GPU(s)"));
  // The host backend may share GPUs between ranks; it trains on the host.
  CHECK(ErrorOf("agents: [{name: a, gpus: 1, ranks: 2, backend: mpi}]\n").empty());
  // An explicit host backend on a GPU agent is the user's choice; single is one rank.
  CHECK(ErrorOf("agents: [{name: a, gpus: 1, backend: single}]\n").empty());
  CHECK_THAT(ErrorOf("agents: [{name: a, gpus: 2, ranks: 2, backend: single}]\n"),
             Contains("single means one rank; this agent has 2 ranks"));
  CHECK_THAT(ErrorOf("agents: [{name: a, gpus: 0, backend: nccl}]\n"),
             Contains("nccl needs GPUs; this agent has gpus: 0"));
}

TEST_CASE("an agent-worker agent that asks for GPUs is warned that it trains on the CPU") {
  Result<Config> c = LoadConfigString(
      "agents:\n  - {name: cpp, gpus: 1}\n  - {name: torch, gpus: 1, command: [python3, -c, "
      "pass]}\n"
      "  - {name: cpu, gpus: 0}\n",
      "agents.yaml");
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  const std::vector<std::string> w = ConfigWarnings(*c);
  REQUIRE(w.size() == 1);
  CHECK_THAT(w[0], Contains("agent cpp asks for 1 GPU(s) but runs agent-worker") &&
                       Contains("trains on the CPU") && Contains("refuse the nccl group") &&
                       Contains("torch_ppo/train.py"));

  // Many such agents: one warning per kind, naming the first five.
  std::string yaml = "agents:\n";
  for (int i = 0; i < 8; ++i) yaml += "  - {name: w" + std::to_string(i) + ", gpus: 1}\n";
  yaml += "  - {name: host, gpus: 1, backend: single}\n";
  Result<Config> many = LoadConfigString(yaml, "agents.yaml");
  REQUIRE(many.ok());
  const std::vector<std::string> grouped = ConfigWarnings(*many);
  REQUIRE(grouped.size() == 2);
  CHECK_THAT(grouped[0], Contains("agent host asks for 1 GPU(s)") && Contains("stay reserved"));
  CHECK_THAT(grouped[1], Contains("8 agents (w0, w1, w2, w3, w4, and 3 more) ask for GPUs") &&
                             Contains("refuse the nccl group"));
}

TEST_CASE("a channel on the snapshots' old topic policies/ is warned about, naming the new one") {
  Result<Config> c = LoadConfigString(
      "agents:\n  - {name: a}\n  - {name: b}\n"
      "channels:\n  - {topic: \"policies/{agent}\", publishers: [\"*\"], subscribers: [\"*\"]}\n",
      "agents.yaml");
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  const std::vector<std::string> w = ConfigWarnings(*c);
  REQUIRE(w.size() == 1);
  CHECK_THAT(w[0], Contains("channel policies/a (and 1 more)") && Contains("weights/{agent}"));
  Result<Config> now = LoadConfigString(
      "agents:\n  - {name: a}\n"
      "channels:\n  - {topic: \"weights/{agent}\", publishers: [\"*\"], subscribers: [\"*\"]}\n",
      "agents.yaml");
  REQUIRE(now.ok());
  CHECK(ConfigWarnings(*now).empty());
}

TEST_CASE("one launch-mode rule: mpi agents of more than one rank start under mpirun or srun") {
  CHECK(LaunchesThroughMpi(GroupBackend::kMpi, 2));
  CHECK_FALSE(LaunchesThroughMpi(GroupBackend::kMpi, 1));
  CHECK_FALSE(LaunchesThroughMpi(GroupBackend::kNccl, 2));
  CHECK_FALSE(LaunchesThroughMpi(GroupBackend::kSingle, 1));
}

}  // namespace
}  // namespace agentrt
