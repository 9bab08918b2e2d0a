// Machine-wide port leases: two runs never hold one port; a dead owner's lease
// is reclaimed by the kernel; a conflict names the holder.
#include "plan/port_lease.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>

#include "tests/common/temp_dir.h"

namespace agentrt {
namespace {

namespace fs = std::filesystem;

using LeaseDir = testing::TempDir;

TEST_CASE("a moved port block keeps MASTER_PORT at its offset, or at its first port") {
  CHECK(MovedMasterPort(20016, 20000, 30000, 30031) == 30016);
  CHECK(MovedMasterPort(20000, 20000, 30000, 30031) == 30000);
  CHECK(MovedMasterPort(20031, 20000, 30000, 30031) == 30031);
  // A new block narrower than the offset, or a port that was outside the old block.
  CHECK(MovedMasterPort(20016, 20000, 30000, 30007) == 30000);
  CHECK(MovedMasterPort(19999, 20000, 30000, 30031) == 30000);
}

TEST_CASE("two runs never lease one port, whatever their blocks' boundaries") {
  LeaseDir dir;
  auto a = PortLeases::Open("/runs/a", dir.path);
  auto b = PortLeases::Open("/runs/b", dir.path);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  REQUIRE((*a)->Acquire(20000, 20015).ok());
  const Status overlap = (*b)->Acquire(20008, 20023);
  REQUIRE_FALSE(overlap.ok());
  CHECK(overlap.code() == StatusCode::kAlreadyExists);
  CHECK_THAT(overlap.message(), Catch::Contains("port 20008") && Catch::Contains("run /runs/a") &&
                                    Catch::Contains("pid " + std::to_string(::getpid())));
  CHECK_FALSE((*b)->Free(20015, 20015));
  CHECK((*b)->Free(20016, 20031));
  CHECK((*b)->Acquire(20016, 20031).ok());
  CHECK_FALSE((*a)->Free(20016, 20016));  // b's now
  CHECK_FALSE((*a)->Free(20000, 20000));  // a's own lease is not free either
  // Released, or its owner gone: free again.
  REQUIRE((*a)->Release(20000, 20015).ok());
  CHECK((*b)->Free(20000, 20007));
  b->reset();
  CHECK((*a)->Acquire(20016, 20031).ok());
}

TEST_CASE("a batch of leases writes the owner file once, naming every range, when it ends") {
  LeaseDir dir;
  auto a = PortLeases::Open("/runs/a", dir.path);
  auto b = PortLeases::Open("/runs/b", dir.path);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  const std::string owner_file = dir.path + "/owners/" + std::to_string(::getpid()) + ".json";
  {
    PortLeases::Batch batch(**a);
    for (int block = 0; block < 100; ++block)
      REQUIRE((*a)->Acquire(30000 + 16 * block, 30015 + 16 * block).ok());
    CHECK_FALSE(fs::exists(owner_file));  // not yet: once, at the end
    // The leases hold at once, whatever the owner file says.
    CHECK((*b)->Acquire(30800, 30800).code() == StatusCode::kAlreadyExists);
  }
  REQUIRE(fs::exists(owner_file));
  const Status taken = (*b)->Acquire(31599, 31599);  // the last block's last port
  CHECK_THAT(taken.message(), Catch::Contains("run /runs/a"));
}

TEST_CASE("a lease dies with its owner, however it dies, and its owner file is cleaned up") {
  LeaseDir dir;
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    auto mine = PortLeases::Open("/runs/child", dir.path);
    if (!mine.ok() || !(*mine)->Acquire(21000, 21015).ok()) ::_exit(1);
    (void)!::write(ready[1], "x", 1);
    ::pause();  // until killed: no destructor runs
    ::_exit(0);
  }
  char c = 0;
  REQUIRE(::read(ready[0], &c, 1) == 1);
  auto parent = PortLeases::Open("/runs/parent", dir.path);
  REQUIRE(parent.ok());
  const Status held = (*parent)->Acquire(21000, 21015);
  REQUIRE_FALSE(held.ok());
  CHECK_THAT(held.message(),
             Catch::Contains("run /runs/child (pid " + std::to_string(child) + ")"));
  REQUIRE(::kill(child, SIGKILL) == 0);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK((*parent)->Acquire(21000, 21015).ok());
  // The dead child's owner file is removed the next time someone looks for a holder.
  auto other = PortLeases::Open("/runs/other", dir.path);
  REQUIRE(other.ok());
  CHECK_FALSE((*other)->Acquire(21000, 21000).ok());
  CHECK_FALSE(fs::exists(dir.path + "/owners/" + std::to_string(child) + ".json"));
  ::close(ready[0]);
  ::close(ready[1]);
}

TEST_CASE("the lease directory and file can be shared by every user") {
  LeaseDir dir;
  auto l = PortLeases::Open("/runs/a", dir.path + "/shared");
  REQUIRE(l.ok());
  CHECK((fs::status(dir.path + "/shared").permissions() & fs::perms::others_write) !=
        fs::perms::none);
  CHECK((fs::status(dir.path + "/shared").permissions() & fs::perms::sticky_bit) !=
        fs::perms::none);
  CHECK((fs::status(dir.path + "/shared/ports.lock").permissions() & fs::perms::others_write) !=
        fs::perms::none);
  CHECK_FALSE((*l)->Acquire(0, 10).ok());
  CHECK_FALSE((*l)->Acquire(20, 10).ok());
}

}  // namespace
}  // namespace agentrt
