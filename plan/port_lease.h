// Machine-wide port leases: every port a run uses on a machine (the bus, every
// agent's block) is leased for the run's lifetime, so concurrent runs of any
// users, in any run directories, local or inside SLURM steps that share a node,
// never hand out the same port.
//
// How: one lock file, `<dir>/ports.lock` (mode 0666 in a 1777 directory, so
// every user can lock it), and one Linux open-file-description byte-range lock
// (F_OFD_SETLK) per leased range, with byte offset = port number. The kernel
// decides conflicts between any two ranges whatever their boundaries, across
// processes and users, and drops a lease the moment its owner's descriptor is
// closed — when the run ends, or when its process dies, however it dies: a
// lease of a dead owner is reclaimed with no clean-up step and no timeout. Next
// to it, `<dir>/owners/<pid>.json` says which run holds which ranges, so a
// conflict names the holder ("ports 20016-20031 are held by run /runs/demo-...
// (pid 4242)"); stale owner files of dead pids are removed when found.
//
// The directory is AGENTRT_PORT_LEASE_DIR, else /run/lock/agentrt (not /tmp:
// SLURM's job_container/tmpfs gives each job a private /tmp), else
// /tmp/agentrt-ports. Leases are per machine: they do not reach other nodes.
//
// Thread-safety: a PortLeases object is used by one thread. Its descriptor is
// close-on-exec, so children do not keep a run's leases alive.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace agentrt {

// True while a process `pid` runs on this machine (ours or another user's):
// what decides that a lease owner, or a controller's leftovers, are gone.
bool PidAlive(long pid);

// True when a server could bind TCP `port` on every interface of this node now
// (SO_REUSEADDR, as servers set it: an old connection in TIME_WAIT does not
// count, a program listening there does). Bound and closed at once; false
// also when no socket can be made.
bool PortBindable(int port);

// The first port, trying `preferred` then the rest of [first, last] in order,
// that can be bound now on all interfaces. ResourceExhausted naming the block
// and `agent` when none can. Every launch backend picks an agent's
// MASTER_PORT with it.
Result<int> PickFreePort(const std::string& agent, int preferred, int first, int last);

// Where an agent's MASTER_PORT lands when its port block moves from one that
// starts at `old_first` to [first, last]: at the same offset into the block,
// or at the block's first port when that offset does not fit. The one rule
// of the planner's lease moves and `agentctl sbatch`'s run-wide blocks.
int MovedMasterPort(int master_port, int old_first, int first, int last);

// AGENTRT_PORT_LEASE_DIR, /run/lock/agentrt or /tmp/agentrt-ports (see above).
std::string DefaultPortLeaseDir();

class PortLeases {
 public:
  // Opens (creating) the lease directory and lock file. `owner` names the
  // holder in other runs' messages (the run directory).
  static Result<std::unique_ptr<PortLeases>> Open(std::string owner,
                                                  std::string dir = DefaultPortLeaseDir());
  ~PortLeases();  // releases every lease and removes the owner file
  PortLeases(const PortLeases&) = delete;
  PortLeases& operator=(const PortLeases&) = delete;

  // Leases [first, last] for as long as this object lives (or until Release).
  // AlreadyExists naming the port and, when known, the run and pid holding it;
  // an errno status when the lock file cannot be locked at all.
  Status Acquire(int first, int last);
  // Acquire, except that ports of the range this object's run (its `owner`)
  // already holds from another process on this machine count as leased (not
  // added to held()); the others are leased here, all or none: the rank
  // wrapper of a SLURM step finds its agent's block, or the bus port inside
  // it, held by the run's controller on the same machine.
  Status AcquireForRun(int first, int last);
  // Releases a range leased by Acquire (exactly as it was acquired).
  Status Release(int first, int last);

  // True when [first, last] could be leased now (by anyone but this object).
  bool Free(int first, int last) const;

  const std::vector<std::pair<int, int>>& held() const { return held_; }
  const std::string& dir() const { return dir_; }

  // While a Batch lives, Acquire and Release leave the owner file alone; it is
  // written once when the batch ends, so leasing a run's N blocks writes it
  // once, not N times (each time with every range held so far).
  class Batch {
   public:
    explicit Batch(PortLeases& leases) : leases_(leases) { ++leases_.batch_depth_; }
    ~Batch() {
      if (--leases_.batch_depth_ == 0) leases_.WriteOwnerFile();
    }
    Batch(const Batch&) = delete;
    Batch& operator=(const Batch&) = delete;

   private:
    PortLeases& leases_;
  };

 private:
  PortLeases(std::string owner, std::string dir, int fd);
  void WriteOwnerFile() const;
  std::string Holder(int port) const;  // "run X (pid N)" or ""
  // The runs (owners) whose live owner files claim `port`.
  std::vector<std::string> HolderRuns(int port) const;

  std::string owner_;
  std::string dir_;
  int fd_ = -1;
  std::vector<std::pair<int, int>> held_;
  int batch_depth_ = 0;  // Batch scopes open
};

}  // namespace agentrt
