#include "slurm/sbatch_writer.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "comms/auth.h"
#include "plan/run_dir.h"
#include "tests/slurm/test_plans.h"

using namespace agentrt;
using namespace agentrt::slurm;
using agentrt::slurm::testing::AddAgent;

namespace {

Plan FourAgentsTwoShapes(const std::string& run_dir) {
  Plan plan;
  plan.run = "pp";
  plan.run_dir = run_dir;
  plan.bus = {"n1", 20000, {}, {}};
  AddAgent(plan, "predator-0", 2, 2, "n1", 20016, run_dir);
  AddAgent(plan, "prey-0", 1, 1, "n1", 20032, run_dir);
  AddAgent(plan, "predator-1", 2, 2, "n1", 20048, run_dir);
  AddAgent(plan, "prey-1", 1, 1, "n1", 20064, run_dir);
  return plan;
}

SbatchOptions Options(const std::string& run_dir) {
  SbatchOptions o;
  o.run_dir = run_dir;
  o.agentctl_path = "/opt/agentrt/bin/agentctl";
  o.bus_path = "/opt/agentrt/bin/agentrt-bus";
  o.bus_wait_s = 120;
  return o;
}

std::string ReadFile(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

TEST_CASE("agents of the same resource shape become one job array each") {
  Plan plan = FourAgentsTwoShapes("/runs/pp");
  SlurmConfig slurm;
  slurm.partition = "gpu";
  slurm.account = "rl";
  slurm.time = "02:00:00";
  slurm.signal_grace_s = 90;
  auto set = GenerateSbatchSet(plan, slurm, Options("/runs/pp"));
  REQUIRE(set.ok());
  REQUIRE(set->arrays.size() == 2);
  const ArrayJob& big = set->arrays[0];
  const ArrayJob& small = set->arrays[1];
  CHECK(big.agents == std::vector<std::string>{"predator-0", "predator-1"});
  CHECK(small.agents == std::vector<std::string>{"prey-0", "prey-1"});
  CHECK(big.file_name == "array-gpu2-rank2.sbatch");
  CHECK(small.file_name == "array-gpu1-rank1.sbatch");
  for (const char* line :
       {"#SBATCH --array=0-1\n", "#SBATCH --gres=gpu:2\n", "#SBATCH --ntasks=2\n",
        "#SBATCH --cpus-per-task=1\n", "#SBATCH --signal=B:USR2@90\n", "#SBATCH --requeue\n",
        "#SBATCH --partition=gpu\n", "#SBATCH --account=rl\n", "#SBATCH --time=02:00:00\n",
        "AGENTS=(predator-0 predator-1)\n", "BUS_WAIT_S=120\n"}) {
    CHECK_THAT(big.script, Catch::Contains(line));
  }
  CHECK_THAT(small.script, Catch::Contains("#SBATCH --gres=gpu:1\n"));
  CHECK_THAT(small.script, Catch::Contains("#SBATCH --ntasks=1\n"));
  // The task picks its agent by array index and hands over to the plan lookup.
  CHECK_THAT(big.script, Catch::Contains("agent=${AGENTS[$SLURM_ARRAY_TASK_ID]}"));
  // Loop and branch bodies keep their indentation (the script is read by people too).
  CHECK_THAT(big.script, Catch::Contains("\n  sleep 0.1\n  ticks=$((ticks + 1))\ndone\n"));
  CHECK_THAT(big.script, Catch::Contains("\n  wait \"$step\"\n  rc=$?\ndone\n"));
  CHECK_THAT(big.script, Catch::Contains("\n  scontrol requeue"));
  CHECK_THAT(big.script, Catch::Contains("/opt/agentrt/bin/agentctl"));
  CHECK_THAT(big.script, Catch::Contains("array-task --run-dir \"$RUN_DIR\" --agent \"$agent\""));
  // #SBATCH lines are only read before the first command.
  auto first_command = big.script.find("\nset ");
  CHECK(big.script.rfind("#SBATCH", first_command) != std::string::npos);
  CHECK(big.script.find("#SBATCH", first_command) == std::string::npos);

  CHECK_THAT(set->bus_script,
             Catch::Contains("/opt/agentrt/bin/agentrt-bus --plan /runs/pp/plan.json "
                             "--secret-file /runs/pp/secrets/run.secret"));
  CHECK_THAT(set->bus_script, Catch::Contains("--address-file /runs/pp/bus.address"));
  // The bus advertises its node's NodeAddr (node names need not resolve everywhere).
  CHECK_THAT(set->bus_script,
             Catch::Contains("NodeAddr") && Catch::Contains("--advertise-host \"$addr\""));
  CHECK_THAT(set->submit_script,
             Catch::Contains("--dependency=after:\"$bus\" \"$RUN_DIR/array-gpu2-rank2.sbatch\""));
  CHECK_THAT(
      set->submit_script,
      Catch::Contains("--dependency=afterany:\"$a0\":\"$a1\" \"$RUN_DIR/done.sbatch\" \"$bus\""));
}

TEST_CASE("CPU agents get no gres, MPI agents get PMIx, multi-node agents get tasks per node") {
  Plan plan;
  plan.run = "mix";
  AddAgent(plan, "cpu", 0, 2, "n1", 20016, "/r");
  AddAgent(plan, "big", 16, 16, "n2", 20032, "/r");
  plan.agents[1].placement.push_back({"n3", {}, {}});
  auto set = GenerateSbatchSet(plan, {}, Options("/r"));
  REQUIRE(set.ok());
  REQUIRE(set->arrays.size() == 2);
  CHECK(set->arrays[0].file_name == "array-cpu-rank2.sbatch");
  CHECK_THAT(set->arrays[0].script, !Catch::Contains("--gres"));
  CHECK_THAT(set->arrays[0].script,
             Catch::Contains("srun --overlap --kill-on-bad-exit=1 --mpi=pmix "));
  CHECK(set->arrays[1].file_name == "array-gpu16-rank16-node2.sbatch");
  CHECK_THAT(set->arrays[1].script, Catch::Contains("#SBATCH --nodes=2\n"));
  CHECK_THAT(set->arrays[1].script, Catch::Contains("#SBATCH --ntasks-per-node=8\n"));
  CHECK_THAT(set->arrays[1].script, Catch::Contains("#SBATCH --gres=gpu:8\n"));
}

TEST_CASE("a value that would break an #SBATCH line is refused") {
  Plan plan = FourAgentsTwoShapes("/r");
  SlurmConfig slurm;
  slurm.partition = "gpu\n#SBATCH --uid=0";
  auto set = GenerateSbatchSet(plan, slurm, Options("/r"));
  REQUIRE_FALSE(set.ok());
  CHECK_THAT(set.status().message(), Catch::Contains("slurm.partition"));
  CHECK_FALSE(GenerateSbatchSet(plan, {}, Options("relative/dir")).ok());
}

TEST_CASE("an agent whose ranks do not divide over its nodes cannot be an array task") {
  Plan plan;
  plan.run = "odd";
  AddAgent(plan, "odd", 3, 3, "n1", 20016, "/r");
  plan.agents[0].placement.push_back({"n2", {}, {}});
  auto set = GenerateSbatchSet(plan, {}, Options("/r"));
  REQUIRE_FALSE(set.ok());
  CHECK_THAT(set.status().message(), Catch::Contains("odd"));
}

TEST_CASE("an agent with a gpu_type asks for the typed GRES, in a shape of its own") {
  Plan plan;
  plan.run = "typed";
  AddAgent(plan, "fast", 2, 2, "b1", 20016, "/r");
  plan.agents[0].gpu_type = "b200";
  AddAgent(plan, "plain", 2, 2, "h1", 20032, "/r");
  auto set = GenerateSbatchSet(plan, {}, Options("/r"));
  REQUIRE(set.ok());
  REQUIRE(set->arrays.size() == 2);  // same counts, different types: two arrays
  std::string all;
  for (const auto& a : set->arrays) all += a.script;
  CHECK_THAT(all, Catch::Contains("#SBATCH --gres=gpu:b200:2\n"));
  CHECK_THAT(all, Catch::Contains("#SBATCH --gres=gpu:2\n"));
}

TEST_CASE("port blocks become unique across the run, keeping blocks that already are") {
  Plan plan;
  plan.run = "ports";
  plan.bus = {"n1", 20000, {}, {}};
  AddAgent(plan, "a", 1, 1, "n1", 20016, "/r");
  AddAgent(plan, "b", 1, 1, "n2", 20016, "/r");  // same block, other node
  AddAgent(plan, "c", 1, 1, "n2", 20032, "/r");
  PortConfig ports;  // 20000-29999, 16 per agent
  REQUIRE(MakePortsRunUnique(plan, ports).ok());
  CHECK(plan.agents[0].ports.first == 20016);
  CHECK(plan.agents[2].ports.first == 20032);
  const PortBlock& b = plan.agents[1].ports;
  CHECK(b.last - b.first == 15);
  CHECK(plan.agents[1].master_port == b.first);
  for (int i = 0; i < 3; ++i) {
    for (int j = i + 1; j < 3; ++j) {
      const PortBlock& x = plan.agents[i].ports;
      const PortBlock& y = plan.agents[j].ports;
      CHECK((x.last < y.first || y.last < x.first));
    }
    CHECK((plan.agents[i].ports.first > 20000 || plan.agents[i].ports.last < 20000));
  }
  PortConfig tiny{20000, 20031, 16};  // room for the bus's block and one more only
  Plan again = plan;
  again.agents[2].ports = again.agents[0].ports;
  again.agents[1].ports = again.agents[0].ports;
  Status s = MakePortsRunUnique(again, tiny);
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.message(), Catch::Contains("agent"));
}

TEST_CASE(
    "WriteSbatchRun writes the scripts, the plan and 0600 credentials, and no secret in any "
    "script") {
  char tmpl[] = "/tmp/agentrt-sbatch-test.XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  const std::string dir = std::string(tmpl) + "/run";
  Config config;
  config.slurm.time = "00:10:00";
  auto set = WriteSbatchRun(FourAgentsTwoShapes(dir), config, Options(dir));
  REQUIRE(set.ok());
  namespace fs = std::filesystem;
  for (const char* f : {"plan.json", "bus.sbatch", "array-gpu2-rank2.sbatch",
                        "array-gpu1-rank1.sbatch", "done.sbatch", "submit.sh"}) {
    CHECK(fs::exists(fs::path(dir) / f));
  }
  CHECK(fs::is_directory(fs::path(dir) / "logs"));
  CHECK(fs::is_directory(fs::path(dir) / "checkpoints" / "prey-1"));
  struct stat st {};
  REQUIRE(stat((dir + "/secrets").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
  REQUIRE(stat((dir + "/secrets/run.secret").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  auto secret = ReadSecretFile(dir + "/secrets/run.secret");
  REQUIRE(secret.ok());
  for (const char* agent : {"predator-0", "predator-1", "prey-0", "prey-1"}) {
    std::string path = dir + "/secrets/" + agent + ".token";
    REQUIRE(stat(path.c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0600);
    auto cred = ReadTokenFile(path);
    REQUIRE(cred.ok());
    CHECK(cred->agent == agent);
    CHECK(cred->token == DeriveAgentToken(*secret, agent));
  }
  // No script and not the plan holds the secret or a token (raw or hex).
  std::string hex;
  for (unsigned char c : *secret) hex += fmt::format("{:02x}", c);
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    std::string text = ReadFile(entry.path());
    INFO(entry.path().string());
    CHECK(text.find(*secret) == std::string::npos);
    CHECK(text.find(hex) == std::string::npos);
    for (const char* agent : {"predator-0", "prey-1"}) {
      CHECK(text.find(DeriveAgentToken(*secret, agent)) == std::string::npos);
    }
  }
  auto plan = ReadPlanFile(dir + "/plan.json");
  REQUIRE(plan.ok());
  CHECK(plan->run_dir == dir);
  fs::remove_all(tmpl);
}
