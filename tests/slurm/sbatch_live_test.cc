// `agentctl sbatch --submit` against the real SLURM test cluster: four agents
// of two shapes become two job arrays, every array task succeeds, every agent
// saw its own GPUs (pairwise disjoint, while all four ran at once), and no
// script and no job environment holds the run secret or a token.
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "comms/auth.h"
#include "comms/bus_client.h"
#include "plan/agent_env.h"
#include "plan/fence.h"
#include "plan/run_dir.h"
#include "slurm/command_runner.h"
#include "slurm/slurm_client.h"

using namespace agentrt;
using namespace agentrt::slurm;
namespace fs = std::filesystem;

namespace {

std::string ReadFile(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteFile(const fs::path& p, const std::string& text) {
  std::ofstream out(p);
  out << text;
}

std::vector<std::string> Words(const std::string& text, char sep = ' ') {
  std::vector<std::string> words;
  std::stringstream in(text);
  std::string w;
  while (std::getline(in, w, sep)) {
    while (!w.empty() && (w.back() == '\n' || w.back() == ' ')) w.pop_back();
    if (!w.empty()) words.push_back(w);
  }
  return words;
}

// Every log file of the run, for the failure message.
std::string Logs(const fs::path& run) {
  std::string all;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(run / "logs", ec)) {
    all += "---- " + e.path().string() + "\n" + ReadFile(e.path());
  }
  return all;
}

// Cancels whatever the test submitted, also when a REQUIRE fails.
struct CancelOnExit {
  SlurmClient& slurm;
  std::vector<std::string> jobs;
  ~CancelOnExit() {
    for (const auto& j : jobs) (void)slurm.Cancel(j);
  }
};

// Each rank records what it was given, then waits until all six ranks of the
// four agents have, so the agents provably held their GPUs at the same time.
constexpr const char* kAgentScript = R"sh(#!/bin/bash
seen="$AGENTRT_RUN_DIR/seen"
mkdir -p "$seen"
env >"$seen/$AGENTRT_AGENT.$RANK.env"
echo "$CUDA_VISIBLE_DEVICES" >"$seen/$AGENTRT_AGENT.$RANK.gpus"
for _ in $(seq 900); do
  [ "$(ls "$seen"/*.gpus | wc -l)" -ge 6 ] && exit 0
  sleep 0.1
done
echo "agent $AGENTRT_AGENT rank $RANK: the other agents never ran alongside" >&2
exit 1
)sh";

// Skips nothing: fails at once, with the fix, when the test cluster is not there.
fs::path RequireCluster() {
  const char* conf = std::getenv("SLURM_CONF");
  INFO(
      "SLURM_CONF is not set: start the test cluster (slurm/testcluster/start.sh DIR; source "
      "DIR/env.sh) or run "
      "scripts/test.sh");
  REQUIRE(conf != nullptr);
  const char* bin_env = std::getenv("AGENTRT_BIN_DIR");
  REQUIRE(bin_env != nullptr);
  const fs::path bin(bin_env);
  INFO("agentctl and agentrt-bus must be built in " << bin.string());
  REQUIRE(fs::exists(bin / "agentctl"));
  REQUIRE(fs::exists(bin / "agentrt-bus"));
  return bin;
}

fs::path TempDir() {
  char tmpl[] = "/tmp/agentrt-sbatch-live.XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  return fs::path(tmpl);
}

// `agentctl sbatch <work>/agents.yaml -o <run>` with `extra` arguments.
Result<CommandOutput> AgentctlSbatch(CommandRunner& runner, const fs::path& bin,
                                     const fs::path& work, const fs::path& run,
                                     const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {(bin / "agentctl").string(), "sbatch",
                                   (work / "agents.yaml").string(), "-o", run.string()};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return runner.Run(argv, 180);
}

// Writes and submits the run (the bus job waits up to 90 s); requires success.
void SubmitRun(CommandRunner& runner, const fs::path& bin, const fs::path& work,
               const fs::path& run) {
  auto out = AgentctlSbatch(runner, bin, work, run, {"--bus-wait", "90", "--submit"});
  REQUIRE(out.ok());
  INFO("agentctl sbatch stdout:\n" << out->out << "stderr:\n" << out->err);
  REQUIRE(out->exit_code == 0);
}

// A one-agent config running `script` on one fake GPU.
std::string OneAgentConfig(const fs::path& work, const std::string& gpus = "1") {
  return fmt::format(R"(run: {{name: one, dir: {work}}}
slurm: {{time: "00:05:00", signal_grace_s: 30}}
agents:
  - name: solo
    gpus: {gpus}
    command: [bash, {work}/agent.sh]
)",
                     fmt::arg("work", work.string()), fmt::arg("gpus", gpus));
}

// Preemption: the first incarnation checkpoints on USR2 and exits; the requeued
// one resumes from that checkpoint, and ends once the test says "release"
// (it looks at the bus meanwhile). Each leaves its environment for the test.
constexpr const char* kPreemptibleAgent = R"sh(#!/bin/bash
echo "agent $AGENTRT_AGENT restart $AGENTRT_RESTART_COUNT (SLURM_RESTART_COUNT=${SLURM_RESTART_COUNT:-0})"
env >"$AGENTRT_RUN_DIR/env.$AGENTRT_RESTART_COUNT"
if [ "$AGENTRT_RESTART_COUNT" = 0 ]; then
  trap 'echo "step $i" >"$AGENTRT_CKPT_DIR/checkpoint"; echo checkpointed; exit 0' USR2
  touch "$AGENTRT_RUN_DIR/started"
  for i in $(seq 1200); do sleep 0.1; done
  echo "never preempted" >&2
  exit 1
fi
echo "restart $AGENTRT_RESTART_COUNT resumed from $(cat "$AGENTRT_CKPT_DIR/checkpoint")" >"$AGENTRT_RUN_DIR/resumed"
for i in $(seq 600); do [ -e "$AGENTRT_RUN_DIR/release" ] && exit 0; sleep 0.1; done
)sh";

// A bus client of the array task whose environment `env_file` holds, as the
// launch `launch` (what its fence names).
std::unique_ptr<BusClient> ArrayTaskBusClient(const fs::path& env_file, const std::string& launch) {
  std::vector<std::string> lines;
  std::istringstream in(ReadFile(env_file));
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  auto env = AgentEnv::Parse(EnvLookupOf(lines));
  REQUIRE(env.ok());
  BusClientOptions o;
  o.incarnation = launch;
  auto client = BusClient::ForAgent(*env, o);
  REQUIRE(client.ok());
  return std::move(client).value();
}

}  // namespace

TEST_CASE(
    "agentctl sbatch: 4 agents of two shapes run as two job arrays on real SLURM with disjoint "
    "GPUs") {
  const fs::path bin = RequireCluster();
  const fs::path work = TempDir();
  const fs::path run = work / "run";
  WriteFile(work / "agent.sh", kAgentScript);
  WriteFile(work / "agents.yaml", fmt::format(R"(run: {{name: arrays, dir: {work}}}
slurm: {{time: "00:05:00", signal_grace_s: 30}}
agents:
  - name: big
    replicas: 2
    gpus: 2
    ranks: 2
    command: [bash, {work}/agent.sh]
  - name: small
    replicas: 2
    gpus: 1
    ranks: 1
    command: [bash, {work}/agent.sh]
)",
                                              fmt::arg("work", work.string())));

  auto runner = MakeProcessRunner();
  SlurmClient slurm(*runner, {60, 0.5});
  SubmitRun(*runner, bin, work, run);

  const std::string bus_job = Words(ReadFile(run / "bus.jobid")).at(0);
  const std::vector<std::string> arrays = Words(ReadFile(run / "arrays.jobids"));
  CancelOnExit guard{slurm, arrays};
  guard.jobs.push_back(bus_job);
  REQUIRE(arrays.size() == 2);
  CHECK(fs::exists(run / "array-gpu2-rank2.sbatch"));
  CHECK(fs::exists(run / "array-gpu1-rank1.sbatch"));

  auto finished = slurm.WaitForJobs(arrays, 200);
  INFO("job logs:\n" << Logs(run));
  REQUIRE(finished.ok());
  REQUIRE(finished->size() == 4);  // one array task per agent
  for (const JobRecord& task : *finished) {
    INFO("array task " << task.DisplayId() << " " << task.state_text << " exit " << task.exit_code);
    CHECK(task.state == JobState::kCompleted);
    CHECK(task.exit_code == 0);
  }

  // What every rank saw: its agent's GPUs, the same for all its ranks.
  const std::map<std::string, int> expected = {
      {"big-0", 2}, {"big-1", 2}, {"small-0", 1}, {"small-1", 1}};
  std::map<std::string, std::set<std::string>> gpus_of;
  for (const auto& [agent, count] : expected) {
    int ranks = agent.rfind("big", 0) == 0 ? 2 : 1;
    std::string first;
    for (int r = 0; r < ranks; ++r) {
      fs::path f = run / "seen" / fmt::format("{}.{}.gpus", agent, r);
      REQUIRE(fs::exists(f));
      std::string cvd = Words(ReadFile(f)).at(0);
      if (r == 0) first = cvd;
      CHECK(cvd == first);
      for (const auto& g : Words(cvd, ',')) gpus_of[agent].insert(g);
    }
    CHECK(static_cast<int>(gpus_of[agent].size()) == count);
  }
  std::set<std::string> all;
  size_t total = 0;
  for (const auto& [agent, ids] : gpus_of) {
    all.insert(ids.begin(), ids.end());
    total += ids.size();
  }
  CHECK(all.size() == total);  // pairwise disjoint

  // The contract reached the ranks, and no secret did.
  auto secret = ReadSecretFile((run / "secrets" / "run.secret").string());
  REQUIRE(secret.ok());
  std::string hex;
  for (unsigned char c : *secret) hex += fmt::format("{:02x}", c);
  std::vector<std::string> forbidden = {*secret, hex};
  for (const auto& [agent, count] : expected) forbidden.push_back(DeriveAgentToken(*secret, agent));
  for (const auto& entry : fs::directory_iterator(run / "seen")) {
    if (entry.path().extension() != ".env") continue;
    const std::string env = ReadFile(entry.path());
    INFO(entry.path().string());
    CHECK_THAT(env, Catch::Contains("AGENTRT_BUS="));
    CHECK_THAT(env, Catch::Contains("AGENTRT_TOKEN_FILE=" + (run / "secrets").string()));
    CHECK_THAT(env, Catch::Contains("AGENTRT_CKPT_DIR=" + (run / "checkpoints").string()));
    for (const auto& f : forbidden) CHECK(env.find(f) == std::string::npos);
  }
  for (const auto& entry : fs::directory_iterator(run)) {
    if (!entry.is_regular_file()) continue;
    const std::string text = ReadFile(entry.path());
    INFO(entry.path().string());
    for (const auto& f : forbidden) CHECK(text.find(f) == std::string::npos);
  }

  // The done job stops the bus once the arrays have ended.
  auto bus = slurm.WaitForJobs({bus_job}, 60);
  REQUIRE(bus.ok());
  CHECK(bus->at(0).state == JobState::kCancelled);
  fs::remove_all(work);
}

TEST_CASE(
    "USR2 on an array task: the agent checkpoints, the task requeues and resumes with restart "
    "count 1") {
  const fs::path bin = RequireCluster();
  const fs::path work = TempDir();
  const fs::path run = work / "run";
  WriteFile(work / "agent.sh", kPreemptibleAgent);
  WriteFile(work / "agents.yaml", OneAgentConfig(work));
  auto runner = MakeProcessRunner();
  SlurmClient slurm(*runner, {60, 0.5});
  SubmitRun(*runner, bin, work, run);
  const std::string array = Words(ReadFile(run / "arrays.jobids")).at(0);
  CancelOnExit guard{slurm, {array, Words(ReadFile(run / "bus.jobid")).at(0)}};

  // Bounded wait for the agent to be running, then preempt it as SLURM would.
  for (int i = 0; i < 600 && !fs::exists(run / "started"); ++i) usleep(100 * 1000);
  INFO("job logs:\n" << Logs(run));
  REQUIRE(fs::exists(run / "started"));
  // The task's launch, as its fence names it, uses the bus.
  const std::string ckpt = (run / "checkpoints" / "solo").string();
  const std::string first = ReadCheckpointFence(ckpt).value().value_or("");
  REQUIRE_THAT(first, Catch::StartsWith("slurm-") && Catch::EndsWith(".0"));
  auto old_launch = ArrayTaskBusClient(run / "env.0", first);
  CHECK(old_launch->ListTopics("").ok());
  REQUIRE(slurm.Cancel(array + "_0", {"USR2", true, false}).ok());

  // The requeued task's launch takes the bus over; the old one is fenced off.
  for (int i = 0; i < 1200 && !fs::exists(run / "resumed"); ++i) usleep(100 * 1000);
  REQUIRE(fs::exists(run / "resumed"));
  const std::string second = ReadCheckpointFence(ckpt).value().value_or("");
  CHECK(second == first.substr(0, first.size() - 1) + "1");
  auto new_launch = ArrayTaskBusClient(run / "env.1", second);
  CHECK(new_launch->ListTopics("").ok());
  const auto fenced = old_launch->ListTopics("");
  CHECK(fenced.status().code() == StatusCode::kPermissionDenied);
  CHECK_THAT(fenced.status().message(), Catch::Contains("fenced: launch " + first));
  WriteFile(run / "release", "");

  auto finished = slurm.WaitForJobs({array}, 200);
  REQUIRE(finished.ok());
  REQUIRE(finished->size() == 1);
  const JobRecord& task = finished->at(0);
  CHECK(task.state == JobState::kCompleted);
  CHECK(task.restarts == 1);
  REQUIRE(fs::exists(run / "resumed"));
  CHECK_THAT(ReadFile(run / "resumed"), Catch::StartsWith("restart 1 resumed from step "));
  fs::remove_all(work);
}

TEST_CASE(
    "an array task without a bus fails after its wait with a message naming the bus address file") {
  const fs::path bin = RequireCluster();
  const fs::path work = TempDir();
  const fs::path run = work / "run";
  WriteFile(work / "agent.sh", "#!/bin/bash\nexit 0\n");
  WriteFile(work / "agents.yaml", OneAgentConfig(work));
  auto runner = MakeProcessRunner();
  SlurmClient slurm(*runner, {60, 0.5});
  auto out = AgentctlSbatch(*runner, bin, work, run, {"--bus-wait", "2"});
  REQUIRE(out.ok());
  REQUIRE(out->exit_code == 0);
  // Only the array, no bus job.
  auto array = slurm.Submit((run / "array-gpu1-rank1.sbatch").string());
  REQUIRE(array.ok());
  CancelOnExit guard{slurm, {*array}};
  auto finished = slurm.WaitForJobs({*array}, 120);
  REQUIRE(finished.ok());
  CHECK(finished->at(0).state == JobState::kFailed);
  CHECK(finished->at(0).exit_code == 1);
  CHECK_THAT(Logs(run), Catch::Contains("the bus did not publish its address in " +
                                        (run / "bus.address").string()));
  fs::remove_all(work);
}

TEST_CASE(
    "agentctl sbatch refuses a plan the live cluster cannot hold, before writing or submitting "
    "anything") {
  const fs::path bin = RequireCluster();
  const fs::path work = TempDir();
  const fs::path run = work / "run";
  WriteFile(work / "agent.sh", "#!/bin/bash\nexit 0\n");
  WriteFile(work / "agents.yaml", OneAgentConfig(work, "64"));
  auto runner = MakeProcessRunner();
  auto out = AgentctlSbatch(*runner, bin, work, run, {"--submit"});
  REQUIRE(out.ok());
  INFO(out->err);
  CHECK(out->exit_code == 2);
  CHECK_THAT(out->err, Catch::Contains("solo"));
  CHECK_FALSE(fs::exists(run));
  fs::remove_all(work);
}
