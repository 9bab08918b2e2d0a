// Files written and read whole: the one atomic writer and the one whole-file
// reader of agentrt. plan.json, status.json, token files, the run secret,
// sbatch scripts, checkpoint records and manifests all go through here.
//
// Atomic write: the bytes go to a temporary file next to the target (created
// with `mode`, exactly that mode whatever the umask), are fsync'd, and the
// temporary file is renamed over the target. A reader sees the old content or
// the new, never a part. With `sync_dir` the directory is fsync'd after the
// rename, so the new name itself survives a power loss. Files derived from
// another that is written last (the per-agent plan views beside plan.json) and
// files written by the thousand (agents' token files) may skip the fsync
// (`sync_file = false`) and be made durable together (SyncFileSystemOf): a
// reader still never sees a part.
//
// Thread-safe (no shared state); blocking file I/O.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace agentrt {

struct AtomicWriteOptions {
  int mode = 0644;
  bool sync_dir = false;  // fsync the directory after the rename
  bool sync_file = true;  // fsync the bytes before the rename
};

// Writes `contents` to `path` atomically (see above). Errors name the path.
Status WriteFileAtomic(const std::string& path, std::string_view contents,
                       const AtomicWriteOptions& options = {});

// Flushes every written byte of the file system holding `dir` (syncfs): one
// call that makes many files written with `sync_file = false` durable.
Status SyncFileSystemOf(const std::string& dir);

// Appends `line` and a newline to `path` (created 0644) in one write, then
// fsyncs it: a record log (e.g. RUN_DIR/league/lineage.jsonl) whose lines
// survive a crash once this returns. Errors name the path.
Status AppendLine(const std::string& path, std::string_view line);

// The same inside an open directory: `name` relative to `dir_fd` (symlinks are
// not followed); `dir_path` is only for messages.
Status WriteFileAtomicAt(int dir_fd, const std::string& dir_path, const std::string& name,
                         std::string_view contents, const AtomicWriteOptions& options = {});

// The whole file. NotFound when it does not exist; other errors name the path.
// Refuses files larger than `max_bytes` (DataLoss naming the size).
// Only regular files are read.
Result<std::string> ReadWholeFile(const std::string& path, size_t max_bytes = size_t{1} << 30);
// The same for `name` inside an open directory (AT_FDCWD: the working
// directory), not following a symlink at the last component; `path` names it
// in messages.
Result<std::string> ReadWholeFileAt(int dir_fd, const std::string& name, const std::string& path,
                                    size_t max_bytes);
// ReadWholeFile, but a file in memory (tmpfs) is read through a read-once
// mapping, copied straight into the string: no zeroed buffer and no touch of
// each page's LRU state (a quarter less time than read() for 1 MiB). Its
// size is the one fstat gave (bytes appended meanwhile are not read). Only
// for files that no one truncates while they are read (the process would
// take SIGBUS): the bus's payload files, which the broker only ever removes.
// A file elsewhere is read with read(), as ReadWholeFile does.
Result<std::string> ReadWholeFileMapped(const std::string& path, size_t max_bytes);

// A file that must be readable by its owner only (a secret, a token): its
// content, or PermissionDenied when group or others may read it ("chmod 600"),
// NotFound when it does not exist. `what` names it in messages ("bus token file").
Result<std::string> ReadPrivateFile(const std::string& path, std::string_view what);

// The last `max_lines` lines of the file at `path` that contain `filter` (all
// when empty), oldest first, without their newlines, read from its last
// `window_bytes` only (a line cut by the window's start is left out) and not
// before byte `from` (where a line starts: what was appended since then).
// Empty when the file does not exist or cannot be read: a log that is not
// there has no tail.
std::vector<std::string> ReadLastLines(const std::string& path, size_t max_lines,
                                       size_t window_bytes, std::string_view filter = {},
                                       int64_t from = 0);

// fsync of a directory (so renames and unlinks in it are durable).
Status FsyncDir(const std::string& path);

// Reads up to `size` bytes at `offset` (pread), retrying short reads and
// EINTR until `size` or the end of the file: the bytes read, or -1 (errno).
ssize_t ReadAllAt(int fd, void* data, size_t size, off_t offset);

// CRC32C of a file's first `size` bytes, read through a mapping (no copy),
// a window at a time so that the caller's resident memory stays small; an
// error names `path`.
Result<uint32_t> FileCrc32c(int fd, int64_t size, const std::string& path);

// Writes all `size` bytes at fd's position, retrying short writes and EINTR;
// an error is ErrnoStatus(errno, what + name) (built only then: no allocation
// on the way that works).
Status WriteAll(int fd, const void* data, size_t size, std::string_view what,
                std::string_view name);

// Raises this process's soft limit of open files to its hard limit (the bus
// broker keeps one descriptor per retained large message) and remembers the
// limit it had. A child about to exec calls RestoreOpenFileLimit (safe after
// fork), so agents start with the limit they would have had anyway.
void RaiseOpenFileLimit();
void RestoreOpenFileLimit();

// This kernel's boot id (/proc/sys/kernel/random/boot_id, trimmed): the same
// on every process of one machine (network namespaces included), different
// across machines and reboots. "" when it cannot be read.
std::string BootId();

}  // namespace agentrt
