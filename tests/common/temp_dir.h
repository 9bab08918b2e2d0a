// A fresh directory under $TMPDIR (or a root given) for one test, removed
// with everything in it when the test ends; small files written into it by
// name. The one scratch directory of every C++ test.
#pragma once

#include <stdlib.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

namespace agentrt::testing {

struct TempDir {
  // Under `root` when given (/dev/shm, for a test of files in memory).
  explicit TempDir(const std::string& prefix = "agentrt-test", const std::string& root = "") {
    const std::filesystem::path under =
        root.empty() ? std::filesystem::temp_directory_path() : std::filesystem::path(root);
    std::string tmpl = (under / (prefix + "-XXXXXX")).string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  // The path of `name` inside the directory.
  std::string Path(const std::string& name) const { return path + "/" + name; }
  // Writes `text` to `name` inside the directory and returns its path.
  std::string Write(const std::string& name, const std::string& text) const {
    const std::string p = Path(name);
    std::ofstream out(p, std::ios::binary);
    out << text;
    REQUIRE(out.good());
    return p;
  }

  std::string path;
};

}  // namespace agentrt::testing
