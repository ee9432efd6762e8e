#pragma once
// Errors of the file I/O engine. Both derive from megalith::error (RuntimeError
// in C++ terms); the Python module turns them into OSError with the errno, so
// a missing file is FileNotFoundError there and a full disk OSError(ENOSPC).

#include <cstddef>
#include <cstdint>
#include <string>

#include "megalith/error.h"
#include "megalith/export.h"

namespace megalith::io {

/// A file operation failed; code() is the errno (0 when there is none, e.g. a
/// read that reached the end of the file).
class MEGALITH_API io_error : public error {
 public:
  io_error(int code, const std::string& what);
  int code() const noexcept { return code_; }

 private:
  int code_;
};

/// The filesystem (or the process's file size limit) cannot hold what was
/// asked. The message names the path, the bytes asked for and the bytes free.
class MEGALITH_API disk_full : public io_error {
 public:
  disk_full(int code, const std::string& what, std::string path, std::uint64_t bytes_requested,
            std::uint64_t bytes_free);
  const std::string& path() const noexcept { return path_; }
  std::uint64_t bytes_requested() const noexcept { return requested_; }
  std::uint64_t bytes_free() const noexcept { return free_; }

 private:
  std::string path_;
  std::uint64_t requested_, free_;
};

/// Bytes an unprivileged process may still write on the filesystem holding
/// `path` (statvfs f_bavail * f_frsize; the parent directory is asked when
/// `path` does not exist). 0 when it cannot be found out.
MEGALITH_API std::uint64_t free_bytes(const std::string& path);

/// True for the errnos that mean "no room": ENOSPC, EDQUOT and EFBIG (the
/// file size limit, RLIMIT_FSIZE, or the filesystem's largest file).
MEGALITH_API bool is_no_space(int code) noexcept;

namespace detail {
/// "<strerror(code)> (errno <code>)", thread-safe.
MEGALITH_API std::string errno_text(int code);

/// Throws disk_full when is_no_space(code), else io_error: "<what> '<path>':
/// <strerror> (errno <code>)[; <free> free on its filesystem] [<where>]".
[[noreturn]] MEGALITH_API void throw_errno(int code, const std::string& what,
                                           const std::string& path, std::uint64_t bytes,
                                           const char* where);
}  // namespace detail

}  // namespace megalith::io
