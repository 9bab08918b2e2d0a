// agentrt-test-agent: a tiny agent for integration tests of the run controller.
//
// It builds a Runtime from the environment (plan/agent_env.h), heartbeats, counts steps,
// reports metrics, checkpoints its step counter and resumes from its latest
// checkpoint ("resumed from step N" on stdout). Exit behaviour:
//   --steps N         run N steps in all (counting resumed ones), then exit --exit-code (default 0)
//   --forever         never stop by itself (until SIGTERM/SIGINT)
//   --fail-at-step K  exit with --exit-code right after step K (default code 1 then)
//   --exit-code C     the exit code used by --steps / --fail-at-step
//   --say TEXT        with --fail-at-step: print TEXT on stderr last (what a failing agent says)
//   --bus-connections N  open N fresh bus connections, publish on each to probe/<agent> (and
//                     say at which offset), exit 4 on any refusal
//   --rendezvous      every rank meets at MASTER_PORT (rank 0 serves a TcpStore holding
//                     this run's and agent's identity); a rank that reaches anyone else's
//                     store, or nobody, exits 5
//   --collective      every step, all ranks all-reduce the step through Runtime::group()
//   --slow-rank-ms X  the last rank's steps take X ms longer (its peers wait in the all-reduce)
//   --flops-per-sample F  declares F FLOPs per step (status: achieved FLOP/s and efficiency)
//   --hang MODE       with --collective, in the first incarnation only, at --hang-at-step
//                     rank --hang-rank (default: the last) hangs the group: `skip` (it
//                     leaves out that step's all-reduce), `sleep` (it sleeps an hour before
//                     it), `deadlock` (it calls a barrier where the others all-reduce)
//   --linger-s S      when done, close the runtime (it says bye) and only exit S seconds later
//   --report-every K  report metrics every K steps (default: every step); heartbeats carry
//                     every step
// Checkpoint cadence: one rank follows the wall clock (and SIGUSR2). Ranks of a
// multi-rank agent must save the same step, and this agent has no collective to
// agree on one, so they save every round(interval / step time) steps instead.
// On SIGTERM/SIGINT it stops; with checkpointing on (--ckpt-interval-s > 0) the final
// step is checkpointed before any clean exit. A stop exits 0.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "agent_runtime/runtime.h"
#include "agent_runtime/tcp_store.h"
#include "common/file_util.h"

extern char** environ;

namespace {

void DumpEnvironment(const std::string& dir, const agentrt::AgentEnv& a, int argc, char** argv) {
  nlohmann::json env = nlohmann::json::object();
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv = *e;
    auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  nlohmann::json args = nlohmann::json::array();
  for (int i = 0; i < argc; ++i) args.push_back(argv[i]);
  nlohmann::json out = {
      {"agent", a.agent}, {"rank", a.rank}, {"pid", ::getpid()}, {"env", env}, {"argv", args}};
  std::filesystem::create_directories(dir);
  std::string path = dir + "/" + a.agent + ".rank" + std::to_string(a.rank) + ".json";
  (void)agentrt::WriteFileAtomic(path, out.dump(1) + "\n");  // readers never see half a file
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"agentrt-test-agent: counts steps, heartbeats, checkpoints, resumes"};
  int64_t steps = 100;
  bool forever = false;
  int64_t fail_at_step = -1;
  int exit_code = -1;
  int step_ms = 10;
  double ckpt_interval_s = 0;
  int keep_last = 3;
  size_t state_bytes = 4096;
  int heartbeat_ms = 1000;
  int64_t report_every = 1;
  std::string dump_env;
  std::string say;
  int bus_connections = 0;
  bool rendezvous = false;
  bool collective = false;
  std::string hang;
  int hang_rank = -1;
  int64_t hang_at_step = 5;
  int slow_rank_ms = 0;
  double flops_per_sample = 0;
  double linger_s = 0;
  app.add_option("--steps", steps, "total steps, then exit");
  app.add_flag("--forever", forever, "never stop by itself");
  app.add_option("--fail-at-step", fail_at_step, "exit with --exit-code after this step");
  app.add_option("--exit-code", exit_code, "exit code for --steps/--fail-at-step");
  app.add_option("--step-ms", step_ms, "milliseconds per step");
  app.add_option("--ckpt-interval-s", ckpt_interval_s, "checkpoint every S seconds (0: off)");
  app.add_option("--keep-last", keep_last, "checkpoints kept");
  app.add_option("--state-bytes", state_bytes, "bytes of fake model state per checkpoint");
  app.add_option("--heartbeat-ms", heartbeat_ms, "heartbeat period");
  app.add_option("--report-every", report_every, "steps between two metrics reports")
      ->check(CLI::PositiveNumber);
  app.add_option("--dump-env", dump_env, "write DIR/<agent>.rank<r>.json with env and argv");
  app.add_option("--say", say, "with --fail-at-step: print this on stderr last");
  app.add_option("--bus-connections", bus_connections, "fresh bus connections to open and use");
  app.add_flag("--rendezvous", rendezvous, "every rank meets at MASTER_PORT");
  app.add_flag("--collective", collective, "all-reduce the step every step");
  app.add_option("--hang", hang, "skip | sleep | deadlock (first incarnation only)")
      ->check(CLI::IsMember({"skip", "sleep", "deadlock"}));
  app.add_option("--hang-rank", hang_rank, "the rank that hangs the group (default: last)");
  app.add_option("--hang-at-step", hang_at_step, "the step at which it does");
  app.add_option("--slow-rank-ms", slow_rank_ms, "extra milliseconds per step of the last rank");
  app.add_option("--flops-per-sample", flops_per_sample, "declared FLOPs of one step");
  app.add_option("--linger-s", linger_s, "seconds between saying bye and exiting");
  CLI11_PARSE(app, argc, argv);

  agentrt::RuntimeOptions options;
  options.heartbeat_period = std::chrono::milliseconds(heartbeat_ms);
  options.checkpoint.interval_s = ckpt_interval_s > 0 ? ckpt_interval_s : 0;
  options.checkpoint.keep_last = keep_last;
  options.checkpoint.commit_timeout = std::chrono::seconds(30);
  auto rt_or = agentrt::Runtime::FromEnvironment(options);
  if (!rt_or.ok()) {
    std::cerr << "agentrt-test-agent: " << rt_or.status().ToString() << "\n";
    return 2;
  }
  auto& rt = **rt_or;
  const auto& a = rt.env();
  if (flops_per_sample > 0) rt.SetFlopsPerSample(flops_per_sample);
  std::cout << "agent " << a.agent << " rank " << a.rank << "/" << a.world_size << " pid "
            << ::getpid() << " restart " << a.restart_count << std::endl;
  if (!dump_env.empty()) DumpEnvironment(dump_env, a, argc, argv);
  if (rendezvous) {
    // What NCCL's id exchange does: rank 0 serves on MASTER_PORT, every rank
    // reads the identity it left there. Another run's store would say otherwise.
    const std::string me = a.run_dir + "|" + a.agent;
    agentrt::TcpStoreOptions o;
    o.host = a.master_addr.empty() ? "127.0.0.1" : a.master_addr;
    o.port = a.master_port;
    o.is_server = a.rank == 0;
    o.rank = a.rank;
    o.world_size = a.world_size;
    o.agent = a.agent;
    o.connect_timeout = std::chrono::seconds(30);
    auto store = agentrt::TcpStore::Create(o);
    if (!store.ok()) {
      std::cerr << "agentrt-test-agent: rendezvous: " << store.status().ToString() << std::endl;
      return 5;
    }
    if (a.rank == 0 && !(*store)->Set("identity", me).ok()) return 5;
    auto seen = (*store)->Get("identity", std::chrono::seconds(30));
    if (!seen.ok() || *seen != me) {
      std::cerr << "agentrt-test-agent: rendezvous on port " << a.master_port << " met '"
                << (seen.ok() ? *seen : seen.status().ToString()) << "', not '" << me << "'"
                << std::endl;
      return 5;
    }
    if (!(*store)->Barrier(std::chrono::seconds(30)).ok()) return 5;
    std::cout << "rendezvous on port " << a.master_port << " ok" << std::endl;
  }
  for (int c = 0; c < bus_connections; ++c) {
    agentrt::BusClientOptions bo;
    bo.call_timeout = std::chrono::seconds(20);
    auto bus = agentrt::BusClient::ForAgent(a, bo);
    agentrt::Status s = bus.ok() ? (*bus)->WaitForReady(std::chrono::seconds(20)) : bus.status();
    if (s.ok()) {
      auto ack = (*bus)->Publish("probe/" + a.agent, std::to_string(c));
      s = ack.status();
      if (ack.ok()) {
        std::cout << "published probe/" << a.agent << " at offset " << ack->offset << std::endl;
      }
    }
    if (!s.ok()) {
      std::cerr << "agentrt-test-agent: bus connection " << c << " refused: " << s.ToString()
                << std::endl;
      return 4;
    }
  }
  if (bus_connections > 0) std::cout << bus_connections << " bus connections ok" << std::endl;

  const bool checkpointing = ckpt_interval_s > 0;
  const bool single_rank = a.world_size == 1;
  const int64_t stride = std::max<int64_t>(
      1, static_cast<int64_t>(ckpt_interval_s * 1000.0 / std::max(step_ms, 1) + 0.5));
  auto& ckpt = rt.checkpointer();
  int64_t step = 0;
  std::vector<unsigned char> state(state_bytes);
  if (checkpointing) {
    auto restored = ckpt.Restore();
    if (!restored.ok()) {
      std::cerr << "agentrt-test-agent: " << restored.status().ToString() << std::endl;
      return 3;
    }
    if (restored->restored()) {
      int64_t saved = -1;
      if (!restored->shard.CopyTo("step", &saved, sizeof saved).ok() ||
          !restored->shard.CopyTo("state", state.data(), state.size()).ok()) {
        std::cerr << "agentrt-test-agent: checkpoint step " << restored->step
                  << " has the wrong layout\n";
        return 3;
      }
      step = saved;
      std::cout << "resumed from step " << step << std::endl;
    } else {
      std::cout << restored->Describe() << std::endl;
    }
  }
  auto make_state = [&](agentrt::CheckpointState& cs) {
    cs.AddBytes("step", &step, sizeof step);
    cs.AddBytes("state", state.data(), state.size());
    cs.metadata = {{"agent", a.agent}, {"step", step}};
  };

  agentrt::Group* group = nullptr;
  if (collective) {
    auto g = rt.group();
    if (!g.ok()) {
      std::cerr << "agentrt-test-agent: " << g.status().ToString() << std::endl;
      return 6;
    }
    group = *g;
  }
  if (hang_rank < 0) hang_rank = a.world_size - 1;
  const bool hangs = !hang.empty() && a.restart_count == 0 && a.rank == hang_rank;
  std::cout << "training from step " << step << std::endl;
  const auto start = std::chrono::steady_clock::now();
  int64_t done_this_run = 0;
  while (!rt.ShouldStop()) {
    if (!forever && step >= steps) break;
    std::this_thread::sleep_for(
        std::chrono::milliseconds(step_ms + (a.rank == a.world_size - 1 ? slow_rank_ms : 0)));
    ++step;
    ++done_this_run;
    if (group != nullptr) {
      int64_t value = step;
      agentrt::Status s;
      if (hangs && step == hang_at_step && hang == "sleep") {
        std::cout << "hanging at step " << step << ": sleeping" << std::endl;
        std::this_thread::sleep_for(std::chrono::hours(1));
      }
      if (hangs && step == hang_at_step && hang == "skip") {
        std::cout << "hanging at step " << step << ": skipping its all-reduce" << std::endl;
      } else if (hangs && step == hang_at_step && hang == "deadlock") {
        std::cout << "hanging at step " << step << ": a barrier where the others all-reduce"
                  << std::endl;
        s = group->Barrier();
      } else {
        s = group->AllReduce(&value, 1, agentrt::DataType::kInt64, agentrt::ReduceOp::kMax);
      }
      if (!s.ok()) {
        std::cerr << "agentrt-test-agent: " << s.ToString() << std::endl;
        return 6;
      }
    }
    for (size_t i = 0; i < state.size(); i += 64) state[i] = static_cast<unsigned char>(step + i);
    double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (step % report_every == 0) {
      rt.Report(step, {{"loss", 1.0 / static_cast<double>(step)},
                       {"steps_per_s",
                        elapsed > 0 ? static_cast<double>(done_this_run) / elapsed : 0.0}});
    } else {
      rt.SetStep(step);  // heartbeats carry it
    }
    const bool due = single_rank ? ckpt.SaveDue() : step % stride == 0;
    if (checkpointing && due) {
      agentrt::CheckpointState cs;
      make_state(cs);
      agentrt::Status s = ckpt.SaveAsync(step, cs);
      if (!s.ok()) std::cerr << "agentrt-test-agent: " << s.ToString() << std::endl;
    }
    if (fail_at_step >= 0 && step >= fail_at_step) {
      int code = exit_code >= 0 ? exit_code : 1;
      std::cout << "failing at step " << step << " with exit code " << code << std::endl;
      if (!say.empty()) std::cerr << say << std::endl;  // its last word
      std::_Exit(code);                                 // like a crash: no checkpoint, no bye
    }
  }
  if (checkpointing) {
    // The final state is checkpointed on normal completion, and on a stop request
    // when there is one rank (stopped ranks of a group stand at different steps).
    agentrt::Status s = ckpt.Wait();
    if (s.ok() && (single_rank || !rt.ShouldStop())) {
      agentrt::CheckpointState cs;
      make_state(cs);
      s = ckpt.Save(step, cs);
      if (s.ok()) std::cout << "checkpointed step " << step << " before exit" << std::endl;
    }
    if (!s.ok()) std::cerr << "agentrt-test-agent: " << s.ToString() << std::endl;
  }
  if (rt.ShouldStop()) {
    std::cout << "stopping at step " << step << " (" << rt.stop_reason() << ")" << std::endl;
    return 0;
  }
  std::cout << "done at step " << step << std::endl;
  if (linger_s > 0) {
    rt_or->reset();  // the runtime says bye; the process stays (wedged on its way out)
    std::cout << "said bye; exiting in " << linger_s << " s" << std::endl;
    std::this_thread::sleep_for(std::chrono::duration<double>(linger_s));
  }
  return exit_code >= 0 ? exit_code : 0;
}
