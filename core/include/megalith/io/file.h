#pragma once
// An open file as the I/O engine uses it: one descriptor without O_DIRECT
// (always), and one with O_DIRECT where the filesystem allows it (tmpfs, for
// one, refuses O_DIRECT with EINVAL: then the file is buffered only).
// [Note: direct and buffered on one file] Aligned middles go through the
// direct descriptor, the unaligned head and tail of a range through the
// buffered one. Linux keeps the two coherent (a direct read or write first
// writes back and then drops cached pages in its range), and two requests
// writing disjoint bytes of one page both take the buffered path, so the page
// lock orders them.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "megalith/export.h"

namespace megalith::io {

/// File offsets, lengths and memory addresses of O_DIRECT transfers are
/// multiples of this (the page size: enough for every block device; the
/// logical block size, often 512, would do for some).
constexpr std::size_t kDirectAlignment = 4096;

enum class Access { read, write, read_write };

class MEGALITH_API File {
 public:
  /// Opens `path`. write / read_write create it (mode 0644) when missing and
  /// never truncate it. `direct`: also try O_DIRECT. Throws io_error (errno
  /// ENOENT for a missing file to read, ...) naming the path.
  static std::shared_ptr<File> open(const std::string& path, Access access, bool direct);

  /// Uses a descriptor the caller owns and keeps open while requests on it
  /// run. A second descriptor on the same open file is made through
  /// /proc/self/fd: with O_DIRECT when `direct` (and the fd lacks it), or
  /// without it when the fd was opened with O_DIRECT.
  static std::shared_ptr<File> adopt(int fd, bool direct);

  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  const std::string& path() const { return path_; }
  int buffered_fd() const { return buffered_fd_; }
  /// The O_DIRECT descriptor, or -1 when direct I/O is not in use.
  int direct_fd() const { return direct_active_.load() ? direct_fd_ : -1; }
  bool direct() const { return direct_fd() >= 0; }
  /// Stops using O_DIRECT (a filesystem that opened with it but refuses the transfers).
  void disable_direct() { direct_active_.store(false); }
  /// The file's size now (fstat).
  std::uint64_t size() const;

 private:
  File() = default;
  std::string path_;
  int buffered_fd_ = -1, direct_fd_ = -1;
  bool owns_buffered_ = true, owns_direct_ = true;
  std::atomic<bool> direct_active_{false};
};

/// Whether O_DIRECT works for `path`: an existing file is opened with it; for
/// a directory, or a file not there yet (asked of its directory), a probe file
/// is created and removed there.
MEGALITH_API bool direct_io_supported(const std::string& path);

}  // namespace megalith::io
