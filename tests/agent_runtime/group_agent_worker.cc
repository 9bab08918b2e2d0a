// A stand-in agent rank for the group tests, started by them under mpirun.
//
//   group_agent_worker --mode agent --agent NAME --value V --port P [--iters K]
//     Builds its Group the way an agent does (MakeGroup from the environment:
//     auto -> mpi for a CPU world), all-reduces value*(rank+1)+i for K rounds
//     checking each sum, and meets its peers in a TcpStore on port P (rank 0
//     serves). Prints one RESULT line per rank; exits 0 only when all was right.
//   group_agent_worker --mode timeout --agent NAME
//     Rank 0 all-reduces with a 1 s timeout while the other ranks never join;
//     rank 0 must get DeadlineExceeded, print it and exit non-zero.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "agent_runtime/group.h"
#include "agent_runtime/tcp_store.h"

namespace {

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atoi(v) : fallback;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = "agent";
  std::string agent = "worker";
  int value = 1;
  int port = 0;
  int iters = 200;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i];
    const char* v = argv[i + 1];
    if (key == "--mode")
      mode = v;
    else if (key == "--agent")
      agent = v;
    else if (key == "--value")
      value = std::atoi(v);
    else if (key == "--port")
      port = std::atoi(v);
    else if (key == "--iters")
      iters = std::atoi(v);
  }
  // What the Runtime fills in from RANK/WORLD_SIZE; mpirun names them its own way.
  agentrt::GroupOptions o;
  o.agent = agent;
  o.rank = EnvInt("OMPI_COMM_WORLD_RANK", 0);
  o.world_size = EnvInt("OMPI_COMM_WORLD_SIZE", 1);
  o.master_addr = "127.0.0.1";
  o.master_port = port;
  auto made = agentrt::MakeGroup(o);
  if (!made.ok()) {
    std::fprintf(stderr, "FATAL: %s\n", made.status().ToString().c_str());
    return 2;
  }
  agentrt::Group& group = **made;
  const int rank = group.rank();
  const int n = group.size();

  if (mode == "timeout") {
    if (rank == 0) {
      const auto t0 = std::chrono::steady_clock::now();
      float x = 1.0f;
      agentrt::Status s = group.AllReduce(&x, 1, agentrt::DataType::kFloat32,
                                          agentrt::ReduceOp::kSum, std::chrono::seconds(1));
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (s.ok()) {
        std::printf("UNEXPECTED: allreduce completed without peers\n");
        return 0;
      }
      std::fprintf(stderr, "FATAL after %.2f s: %s\n", waited, s.ToString().c_str());
      std::fflush(stderr);
      std::_Exit(3);  // as an agent does: fail loudly so the supervisor restarts the group
    }
    // The other ranks never join; rank 0's exit ends the world.
    std::this_thread::sleep_for(std::chrono::seconds(30));
    return 0;
  }

  int mismatches = 0;
  int64_t last = 0;
  for (int i = 0; i < iters; ++i) {
    int64_t x = int64_t{value} * (rank + 1) + i;
    if (!group.AllReduce(&x, 1, agentrt::DataType::kInt64, agentrt::ReduceOp::kSum).ok()) return 4;
    const int64_t expect = int64_t{value} * n * (n + 1) / 2 + int64_t{n} * i;
    if (x != expect) ++mismatches;
    last = x;
  }

  agentrt::TcpStoreOptions so;
  so.host = "127.0.0.1";
  so.port = port;
  so.is_server = rank == 0;
  so.rank = rank;
  so.world_size = n;
  so.agent = agent;
  auto store = agentrt::TcpStore::Create(so);
  bool store_ok = store.ok();
  // What went wrong with the store, said on stderr (a test that sees store=bad shows it).
  auto said = [&](const std::string& what, const agentrt::Status& s) {
    if (!s.ok())
      std::fprintf(stderr, "rank %d: store %s: %s\n", rank, what.c_str(), s.ToString().c_str());
    return s.ok();
  };
  if (store_ok) {
    store_ok = said("set", (*store)->Set("member/" + std::to_string(rank), agent)) &&
               said("first barrier", (*store)->Barrier());
    for (int r = 0; r < n && store_ok; ++r) {
      auto who = (*store)->Get("member/" + std::to_string(r), std::chrono::seconds(30));
      store_ok = said("get member/" + std::to_string(r), who.status());
      if (store_ok && *who != agent) {
        std::fprintf(stderr, "rank %d: store member/%d is %s, not %s\n", rank, r, who->c_str(),
                     agent.c_str());
        store_ok = false;
      }
    }
    // Rank 0's server must outlive the others' last read.
    store_ok = store_ok && said("last barrier", (*store)->Barrier());
  } else {
    std::fprintf(stderr, "%s\n", store.status().ToString().c_str());
  }
  std::printf(
      "RESULT agent=%s rank=%d size=%d backend=%s last=%lld mismatches=%d store=%s port=%d\n",
      agent.c_str(), rank, n, std::string(group.backend()).c_str(), static_cast<long long>(last),
      mismatches, store_ok ? "ok" : "bad", port);
  std::fflush(stdout);
  return mismatches == 0 && store_ok ? 0 : 1;
}
