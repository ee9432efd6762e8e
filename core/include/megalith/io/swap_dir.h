#pragma once
// A per-run swap directory for offloaded state, and fixed-size files in it.
// [Note: swap directory lifecycle]
// - The directory is <root>/megalith-swap-<run>-<id>, <id> unique to this
//   SwapDir (random), and its files are named <id>-<name>.swap: nothing of an
//   earlier run can be taken for this run's state.
// - It holds a marker, megalith-swap.lock, flock()ed for the SwapDir's life.
//   A process that dies (even by SIGKILL) drops the lock, so a directory whose
//   marker can be locked by someone else is stale: find_stale / clean_stale
//   find and remove those; a new SwapDir cleans the stale ones of its host.
// - remove(), the end of the SwapDir and every SwapFile from it (files keep
//   their directory alive), or the exit of the process that made it (an
//   atexit handler; never a forked child's exit) delete the directory.
// - allocate() reserves the whole file up front (posix_fallocate), so a full
//   disk fails there with disk_full naming the bytes asked and free, not
//   halfway through a write; a write that still meets ENOSPC throws the same
//   and leaves other data in place (nothing is truncated or rewritten).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "megalith/export.h"
#include "megalith/io/async_io.h"
#include "megalith/io/file.h"

namespace megalith::io {

namespace detail {
struct SwapState;
}

/// A file of fixed size in a SwapDir; reads and writes go through the dir's AsyncIO.
class MEGALITH_API SwapFile {
 public:
  const std::string& path() const { return path_; }
  std::uint64_t nbytes() const { return nbytes_; }
  bool direct() const { return file_->direct(); }
  /// Throws invalid_argument for a range past nbytes() and error once the dir is removed.
  Request write(const void* src, std::size_t bytes, std::uint64_t offset = 0);
  Request read(void* dst, std::size_t bytes, std::uint64_t offset = 0);

 private:
  friend class SwapDir;
  SwapFile(std::shared_ptr<detail::SwapState> dir, std::shared_ptr<File> file, std::string path,
           std::uint64_t nbytes);
  void check(const char* op, std::size_t bytes, std::uint64_t offset) const;
  std::shared_ptr<detail::SwapState> dir_;
  std::shared_ptr<File> file_;
  std::string path_;
  std::uint64_t nbytes_;
};

class MEGALITH_API SwapDir {
 public:
  static constexpr const char* kPrefix = "megalith-swap-";
  static constexpr const char* kMarker = "megalith-swap.lock";

  /// Creates the directory under `root` (made when missing). `run_name` goes
  /// into the directory name (other characters than [A-Za-z0-9._-] become
  /// '_'; empty: "run"). `io`: the engine for the files (default: a new one
  /// with default options). `clean_stale`: first remove stale directories
  /// under `root` left by this host.
  explicit SwapDir(const std::string& root, const std::string& run_name = "",
                   std::shared_ptr<AsyncIO> io = nullptr, bool clean_stale = true);
  /// Removes the directory unless a SwapFile from it is still alive (then the last one does).
  ~SwapDir();
  SwapDir(const SwapDir&) = delete;
  SwapDir& operator=(const SwapDir&) = delete;

  const std::string& path() const;
  const std::string& id() const;
  const std::shared_ptr<AsyncIO>& io() const;
  bool removed() const;

  /// A new file of `nbytes`, fully reserved on disk. `name`: [A-Za-z0-9._-]+,
  /// unused in this dir. Throws disk_full (path, bytes asked, bytes free).
  std::shared_ptr<SwapFile> allocate(const std::string& name, std::uint64_t nbytes);
  /// Deletes the directory and its files; files handed out refuse new
  /// requests (requests in flight finish on the unlinked files). Idempotent.
  void remove();

  /// Directories under `root` whose owner is gone (see the note above).
  static std::vector<std::string> find_stale(const std::string& root);
  /// Removes those and returns their paths.
  static std::vector<std::string> clean_stale(const std::string& root);

 private:
  std::shared_ptr<detail::SwapState> state_;
};

}  // namespace megalith::io
