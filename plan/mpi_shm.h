// Open MPI's shared memory between the ranks of one node, kept in folders that
// agentrt removes.
//
// Open MPI's ranks on one node share memory through files in /dev/shm (the
// vader transport's segments, 4 MiB each), which they remove only when they
// finalize: a rank that is killed (a failure, a kill -9 of the controller, a
// node's processes killed) leaves its segment behind. So agentrt points
// Open MPI (OMPI_MCA_btl_vader_backing_directory, unless the user set it) at a
// folder that somebody removes when the ranks are gone:
//
//   - local MPI agents (mpirun, scheduler/local_backend.cc): the controller
//     makes "agentrt-mpi.<controller pid>.<agent>.<incarnation>" per mpirun
//     incarnation and removes it once the incarnation's processes are reaped;
//     a controller that starts removes the folders whose controller pid no
//     longer runs (SweepControllerMpiShmDirs);
//   - MPI agents under srun (the rank wrapper, plan/rank_exec.h): every rank
//     of a step on a node joins "agentrt-mpi.step.<job>.<step>" (StepMpiShm)
//     and holds a shared flock on its ".lock" while its program runs; the last
//     rank to leave removes the folder. A rank killed with its wrapper (a node
//     death, a SIGKILL of the step) leaves the lock free, and the next MPI
//     step to start on that node removes every step folder whose lock nobody
//     holds (SweepStepMpiShmDirs).
#pragma once

#include <string>
#include <string_view>

namespace agentrt {

inline constexpr const char* kOmpiVaderBackingVar = "OMPI_MCA_btl_vader_backing_directory";
inline constexpr const char* kMpiShmRoot = "/dev/shm";
// The prefix of a bus client's node folder (BusClient::NodeCacheDir) under
// kMpiShmRoot: "agentrt-bus.<uid>.<hash of the bus address>".
inline constexpr std::string_view kBusNodeDirPrefix = "agentrt-bus.";

// A new, empty folder (0700) for one mpirun incarnation of `agent` under
// `root`, named with this process's pid; "" when it cannot be made (Open MPI
// then picks its own place).
std::string MakeControllerMpiShmDir(const std::string& root, const std::string& agent,
                                    const std::string& incarnation);
// Removes `dir` and everything in it, and clears it ("" is nothing).
void RemoveMpiShmDir(std::string& dir);
// Removes the controller folders under `root` whose controller pid no longer
// runs. Step folders are not touched.
void SweepControllerMpiShmDirs(const std::string& root);

// One process's membership of a folder that the processes of one node share
// while they run, and the last to leave removes: Open MPI's segments of an
// srun step (below), a weight stream's versions fetched once per node
// (comms/weight_stream.h). Each member holds a shared flock on its ".lock";
// a member killed leaves the lock free, and the next sweep of its prefix on
// that node (SweepSharedNodeDirs) removes the folder.
class SharedNodeDir {
 public:
  SharedNodeDir() = default;
  SharedNodeDir(const SharedNodeDir&) = delete;
  SharedNodeDir& operator=(const SharedNodeDir&) = delete;
  SharedNodeDir(SharedNodeDir&& other) noexcept;
  SharedNodeDir& operator=(SharedNodeDir&& other) noexcept;
  ~SharedNodeDir();  // Leave()

  // Makes or joins `root`/`name` (0700) and takes a shared lock on it; an
  // empty dir() when that fails, `name` is empty or has a '/', or what has
  // the name is not a folder of this user's closed to others (a link, or
  // one another user made first in a shared /dev/shm). A folder being
  // removed by a sweep or the last leaver is made anew.
  static SharedNodeDir Join(const std::string& root, const std::string& name);

  const std::string& dir() const { return dir_; }

  // Drops this member's lock and removes the folder when no other member
  // holds one (the last to leave does). Safe to call twice.
  void Leave();

 private:
  std::string dir_;
  int lock_fd_ = -1;
};

// Removes the folders under `root` named `prefix`... whose lock nobody holds
// (their members were killed), and such folders with no lock file that are
// over a minute old (a member killed between making the folder and locking
// it). Only folders of this user's closed to others are touched (what Join
// makes): not a link, nor another user's. Returns how many it removed.
int SweepSharedNodeDirs(const std::string& root, std::string_view prefix);

// One rank's membership of its step's folder on this node:
// `root`/agentrt-mpi.step.<job>.<step> (empty dir(): Open MPI picks its own place).
using StepMpiShm = SharedNodeDir;
StepMpiShm JoinStepMpiShm(const std::string& root, const std::string& job, const std::string& step);
// SweepSharedNodeDirs of the step folders.
int SweepStepMpiShmDirs(const std::string& root);

}  // namespace agentrt
