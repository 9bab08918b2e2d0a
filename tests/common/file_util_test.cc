// common/file_util.h: the open-files limit the bus raises for itself and a
// child restores before exec (so agents do not inherit the raised one), and
// the tail of a log read from its end, a whole file read through a mapping,
// and a file's CRC32C through mappings.
#include "common/file_util.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/resource.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "common/crc32c.h"
#include "tests/common/temp_dir.h"

TEST_CASE("RaiseOpenFileLimit raises the soft limit; a child restores the one before") {
  rlimit original{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &original) == 0);
  REQUIRE(original.rlim_max >= 256);  // room to start below it
  // Start below the hard limit, as a login shell's 1024 soft limit would.
  rlimit low = original;
  low.rlim_cur = 128;
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
  agentrt::RaiseOpenFileLimit();
  rlimit now{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &now) == 0);
  CHECK(now.rlim_cur == original.rlim_max);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    agentrt::RestoreOpenFileLimit();
    rlimit child{};
    ::getrlimit(RLIMIT_NOFILE, &child);
    ::_exit(child.rlim_cur == 128 ? 0 : 1);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);  // the child runs with the limit from before the raise
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &original) == 0);
}

TEST_CASE("ReadLastLines: the newest lines, oldest first, filtered, within a window") {
  using Lines = std::vector<std::string>;
  agentrt::testing::TempDir dir;
  const std::string log = dir.Write("rank0.log", "one\ntwo\n\nthree four\nfive");
  CHECK(agentrt::ReadLastLines(log, 2, 1 << 20) == Lines{"three four", "five"});
  CHECK(agentrt::ReadLastLines(log, 3, 1 << 20) == Lines{"", "three four", "five"});
  CHECK(agentrt::ReadLastLines(log, 10, 1 << 20) == Lines{"one", "two", "", "three four", "five"});
  CHECK(agentrt::ReadLastLines(log, 10, 1 << 20, "o") == Lines{"one", "two", "three four"});
  CHECK(agentrt::ReadLastLines(log, 0, 1 << 20).empty());
  // A window of the last 11 bytes ("three four\nfive" is 15) cuts "three four":
  // the cut line is left out rather than shown in part.
  CHECK(agentrt::ReadLastLines(log, 10, 11) == Lines{"five"});
  const std::string ended = dir.Write("ended.log", "a\nb\n");
  CHECK(agentrt::ReadLastLines(ended, 10, 1 << 20) == Lines{"a", "b"});
  CHECK(agentrt::ReadLastLines(dir.Path("missing.log"), 5, 1 << 20).empty());
  // Only what was appended since byte 8 (where "two" ends): a later incarnation's output.
  CHECK(agentrt::ReadLastLines(log, 10, 1 << 20, "", 8) == Lines{"", "three four", "five"});
  CHECK(agentrt::ReadLastLines(log, 10, 1 << 20, "", 25).empty());  // nothing since the end
}

TEST_CASE(
    "ReadWholeFileMapped: the bytes read would give, mapped in tmpfs and read elsewhere; what is "
    "wrong named as ReadWholeFile does") {
  // In memory (mapped: /dev/shm, where the bus keeps its files, is tmpfs) and
  // in the temp folder (read(): on disk on a Debian machine).
  const bool in_memory = GENERATE(true, false);
  std::string root;
  if (in_memory) {
    struct statfs fs {};
    REQUIRE(::statfs("/dev/shm", &fs) == 0);
    REQUIRE(fs.f_type == TMPFS_MAGIC);
    root = "/dev/shm";
  }
  agentrt::testing::TempDir dir("agentrt-mapped", root);
  INFO(dir.path);
  const std::string path = dir.path + "/f";
  std::string bytes((size_t{1} << 20) + 77, '\0');  // not a whole number of pages
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>((i * 131) >> 5);
  REQUIRE(agentrt::WriteFileAtomic(path, bytes).ok());
  auto read = agentrt::ReadWholeFileMapped(path, bytes.size());
  REQUIRE(read.ok());
  CHECK(*read == bytes);

  auto big = agentrt::ReadWholeFileMapped(path, bytes.size() - 1);
  CHECK(big.status().code() == agentrt::StatusCode::kDataLoss);
  CHECK(big.status().message().find(path) != std::string::npos);
  auto missing = agentrt::ReadWholeFileMapped(dir.path + "/none", 10);
  CHECK(missing.status().code() == agentrt::StatusCode::kNotFound);
  CHECK(missing.status().message().find(dir.path + "/none") != std::string::npos);
  auto folder = agentrt::ReadWholeFileMapped(dir.path, 10);
  REQUIRE_FALSE(folder.ok());
  CHECK(folder.status().message().find("not a regular file") != std::string::npos);
  REQUIRE(agentrt::WriteFileAtomic(path, "").ok());
  auto empty = agentrt::ReadWholeFileMapped(path, 10);
  REQUIRE(empty.ok());
  CHECK(empty->empty());
}

TEST_CASE(
    "FileCrc32c: a file's first bytes through mappings, windows joined; a bad descriptor named") {
  agentrt::testing::TempDir dir("agentrt-filecrc");
  const std::string path = dir.path + "/f";
  std::string bytes((size_t{20} << 20) + 123, '\0');  // past one 16 MiB window
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>((i * 131) >> 7);
  REQUIRE(agentrt::WriteFileAtomic(path, bytes).ok());
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  auto whole = agentrt::FileCrc32c(fd, static_cast<int64_t>(bytes.size()), path);
  REQUIRE(whole.ok());
  CHECK(*whole == agentrt::Crc32c(bytes.data(), bytes.size()));
  auto prefix = agentrt::FileCrc32c(fd, 4096, path);
  REQUIRE(prefix.ok());
  CHECK(*prefix == agentrt::Crc32c(bytes.data(), 4096));
  ::close(fd);
  auto bad = agentrt::FileCrc32c(fd, 4096, path);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find(path) != std::string::npos);
}
