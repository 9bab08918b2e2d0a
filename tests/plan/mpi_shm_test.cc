// Open MPI's shared-memory folders: the last rank of a step removes its
// folder; a sweep removes the folders of killed ranks or gone controllers and
// nothing that is still in use.
#include "plan/mpi_shm.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/common/temp_dir.h"

namespace agentrt {
namespace {

namespace fs = std::filesystem;

// A 4 MiB segment as Open MPI's vader transport leaves it (a few bytes do).
void WriteSegment(const std::string& dir, int local_rank) {
  std::ofstream(dir + "/vader_segment.n1.0.8dc24f0b." + std::to_string(local_rank)) << "segment";
}

// A pid that ran and no longer does.
pid_t DeadPid() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  return child;
}

TEST_CASE("the last rank of a step to leave removes its folder") {
  testing::TempDir root;
  StepMpiShm a = JoinStepMpiShm(root.path, "41", "3");
  StepMpiShm b = JoinStepMpiShm(root.path, "41", "3");
  REQUIRE(a.dir() == root.path + "/agentrt-mpi.step.41.3");
  REQUIRE(b.dir() == a.dir());
  const std::string dir = a.dir();
  WriteSegment(dir, 0);
  WriteSegment(dir, 1);
  a.Leave();
  CHECK(a.dir().empty());
  CHECK(fs::exists(dir + "/vader_segment.n1.0.8dc24f0b.1"));  // b still runs
  b.Leave();
  CHECK_FALSE(fs::exists(dir));
  b.Leave();  // twice is nothing
}

TEST_CASE("a step folder is refused a name that would leave the root") {
  testing::TempDir root;
  CHECK(JoinStepMpiShm(root.path, "41/../..", "0").dir().empty());
  CHECK(JoinStepMpiShm(root.path, "", "0").dir().empty());
  CHECK(JoinStepMpiShm(root.path + "/missing", "41", "0").dir().empty());
}

TEST_CASE("a sweep removes the step folders of killed ranks and keeps those in use") {
  testing::TempDir root;
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t rank = ::fork();
  REQUIRE(rank >= 0);
  if (rank == 0) {
    StepMpiShm joined = JoinStepMpiShm(root.path, "7", "0");
    WriteSegment(joined.dir(), 0);
    const char ok = joined.dir().empty() ? 'n' : 'y';
    if (::write(ready[1], &ok, 1) != 1) ::_exit(1);
    for (;;) ::pause();  // killed
  }
  ::close(ready[1]);
  char ok = 0;
  REQUIRE(::read(ready[0], &ok, 1) == 1);
  ::close(ready[0]);
  REQUIRE(ok == 'y');
  StepMpiShm live = JoinStepMpiShm(root.path, "7", "1");
  REQUIRE_FALSE(live.dir().empty());

  // A folder whose maker died before locking it: left alone while new,
  // removed once over a minute old.
  const std::string unlocked_new = root.Path("agentrt-mpi.step.8.0");
  const std::string unlocked_old = root.Path("agentrt-mpi.step.9.0");
  fs::create_directory(unlocked_new);
  fs::create_directory(unlocked_old);
  ::chmod(unlocked_new.c_str(), 0700);  // as Join makes them
  ::chmod(unlocked_old.c_str(), 0700);
  const struct timeval old_times[2] = {{::time(nullptr) - 120, 0}, {::time(nullptr) - 120, 0}};
  REQUIRE(::utimes(unlocked_old.c_str(), old_times) == 0);
  // Not a step folder at all.
  fs::create_directory(root.Path("agentrt-mpi.123.a.1"));

  CHECK(SweepStepMpiShmDirs(root.path) == 1);  // only the old unlocked one
  CHECK(fs::exists(root.Path("agentrt-mpi.step.7.0/vader_segment.n1.0.8dc24f0b.0")));
  CHECK_FALSE(fs::exists(unlocked_old));
  CHECK(fs::exists(unlocked_new));

  REQUIRE(::kill(rank, SIGKILL) == 0);
  int status = 0;
  REQUIRE(::waitpid(rank, &status, 0) == rank);
  // And one whose remover was killed after renaming it (its lock file kept).
  const std::string half_removed = root.Path("agentrt-mpi.step.6.0.removing.4242");
  fs::create_directory(half_removed);
  ::chmod(half_removed.c_str(), 0700);
  root.Write("agentrt-mpi.step.6.0.removing.4242/.lock", "");
  CHECK(SweepStepMpiShmDirs(root.path) == 2);  // the killed rank's folder, the half removed one
  CHECK_FALSE(fs::exists(half_removed));
  CHECK_FALSE(fs::exists(root.Path("agentrt-mpi.step.7.0")));
  CHECK(fs::exists(live.dir()));
  CHECK(fs::exists(root.Path("agentrt-mpi.123.a.1")));

  // A step started again after a sweep removed its folder makes it anew.
  StepMpiShm again = JoinStepMpiShm(root.path, "7", "0");
  CHECK(again.dir() == root.Path("agentrt-mpi.step.7.0"));
  CHECK(fs::exists(again.dir() + "/.lock"));
}

TEST_CASE("a controller's folders are removed once its pid no longer runs") {
  testing::TempDir root;
  std::string mine = MakeControllerMpiShmDir(root.path, "pair", "3");
  REQUIRE(mine == root.path + "/agentrt-mpi." + std::to_string(::getpid()) + ".pair.3");
  CHECK((fs::status(mine).permissions() & fs::perms::all) == fs::perms::owner_all);
  WriteSegment(mine, 0);
  const std::string gone = root.Path("agentrt-mpi." + std::to_string(DeadPid()) + ".pair.2");
  fs::create_directory(gone);
  WriteSegment(gone, 0);
  StepMpiShm step = JoinStepMpiShm(root.path, "5", "0");
  REQUIRE_FALSE(step.dir().empty());
  step.Leave();
  // A step folder (here one with no lock file) is not the controllers' sweep's.
  fs::create_directory(root.Path("agentrt-mpi.step.6.0"));

  SweepControllerMpiShmDirs(root.path);
  CHECK_FALSE(fs::exists(gone));
  CHECK(fs::exists(mine + "/vader_segment.n1.0.8dc24f0b.0"));
  CHECK(fs::exists(root.Path("agentrt-mpi.step.6.0")));

  // A new incarnation of the same name starts empty.
  CHECK(MakeControllerMpiShmDir(root.path, "pair", "3") == mine);
  CHECK(fs::is_empty(mine));
  RemoveMpiShmDir(mine);
  CHECK(mine.empty());
  CHECK_FALSE(fs::exists(root.path + "/agentrt-mpi." + std::to_string(::getpid()) + ".pair.3"));
}

TEST_CASE("a shared node folder of another prefix: swept by its own prefix only") {
  testing::TempDir root;
  const std::string name = std::string(kBusNodeDirPrefix) + "0.0badcafe";
  {
    SharedNodeDir a = SharedNodeDir::Join(root.path, name);
    SharedNodeDir b = SharedNodeDir::Join(root.path, name);
    REQUIRE(a.dir() == root.Path(name));
    CHECK((fs::status(a.dir()).permissions() & fs::perms::all) == fs::perms::owner_all);
    CHECK(SweepSharedNodeDirs(root.path, kBusNodeDirPrefix) == 0);  // in use
    a.Leave();
    CHECK(fs::exists(b.dir()));
  }  // b leaves last: removed
  CHECK_FALSE(fs::exists(root.Path(name)));
  CHECK(SharedNodeDir::Join(root.path, "a/b").dir().empty());
  CHECK(SharedNodeDir::Join(root.path, "..").dir().empty());
  // Only a folder of this user's closed to others: not one open to them (as
  // another user could have made it first), nor a link to another folder.
  const std::string open_one = std::string(kBusNodeDirPrefix) + "0.0pen";
  fs::create_directory(root.Path(open_one));
  fs::permissions(root.Path(open_one), fs::perms::owner_all | fs::perms::others_all);
  CHECK(SharedNodeDir::Join(root.path, open_one).dir().empty());
  fs::create_directory(root.Path("elsewhere"));
  ::chmod(root.Path("elsewhere").c_str(), 0700);
  const std::string link = std::string(kBusNodeDirPrefix) + "0.11nk";
  fs::create_directory_symlink(root.Path("elsewhere"), root.Path(link));
  CHECK(SharedNodeDir::Join(root.path, link).dir().empty());
  CHECK_FALSE(fs::exists(root.Path("elsewhere/.lock")));
  fs::remove(root.Path(link));
  fs::remove(root.Path(open_one));

  // A member killed (its lock free): the sweep of its prefix removes the
  // folder, the step folders' sweep does not.
  const pid_t member = ::fork();
  REQUIRE(member >= 0);
  if (member == 0) {
    SharedNodeDir joined = SharedNodeDir::Join(root.path, name);
    ::_exit(joined.dir().empty() ? 1 : 0);  // no Leave: as if killed
  }
  int status = 0;
  REQUIRE(::waitpid(member, &status, 0) == member);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  REQUIRE(fs::exists(root.Path(name)));
  CHECK(SweepStepMpiShmDirs(root.path) == 0);
  CHECK(fs::exists(root.Path(name)));
  CHECK(SweepSharedNodeDirs(root.path, kBusNodeDirPrefix) == 1);
  CHECK_FALSE(fs::exists(root.Path(name)));

  // What the sweep leaves alone, free lock or not: a folder open to others
  // (someone else's, or put there to be removed), and a link to a folder.
  fs::create_directory(root.Path(open_one));
  fs::permissions(root.Path(open_one), fs::perms::owner_all | fs::perms::others_all);
  root.Write(open_one + "/.lock", "");
  root.Write("elsewhere/.lock", "");
  root.Write("elsewhere/precious", "kept");
  fs::create_directory_symlink(root.Path("elsewhere"), root.Path(link));
  const struct timeval old_times[2] = {{::time(nullptr) - 120, 0}, {::time(nullptr) - 120, 0}};
  REQUIRE(::utimes(root.Path(open_one).c_str(), old_times) == 0);
  CHECK(SweepSharedNodeDirs(root.path, kBusNodeDirPrefix) == 0);
  CHECK(fs::exists(root.Path(open_one + "/.lock")));
  CHECK(fs::exists(root.Path("elsewhere/precious")));
  CHECK(fs::is_symlink(root.Path(link)));
}

}  // namespace
}  // namespace agentrt
