// The I/O errors and their messages (errno text, bytes asked, bytes free).
#include "megalith/io/error.h"

#include <sys/statvfs.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "megalith/memory/bytes.h"

namespace megalith::io {

io_error::io_error(int code, const std::string& what) : error(what), code_(code) {}

disk_full::disk_full(int code, const std::string& what, std::string path,
                     std::uint64_t bytes_requested, std::uint64_t bytes_free)
    : io_error(code, what),
      path_(std::move(path)),
      requested_(bytes_requested),
      free_(bytes_free) {}

std::uint64_t free_bytes(const std::string& path) {
  struct statvfs st{};
  if (statvfs(path.c_str(), &st) != 0) {
    const auto slash = path.find_last_of('/');
    const std::string parent =
        slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
    if (statvfs(parent.c_str(), &st) != 0) return 0;
  }
  return static_cast<std::uint64_t>(st.f_bavail) * static_cast<std::uint64_t>(st.f_frsize);
}

bool is_no_space(int code) noexcept { return code == ENOSPC || code == EDQUOT || code == EFBIG; }

namespace detail {

std::string errno_text(int code) {
  char text[128];
  const char* msg = text;
#if defined(__GLIBC__) && defined(_GNU_SOURCE)
  msg = strerror_r(code, text, sizeof(text));  // the GNU form returns the text
#else
  if (strerror_r(code, text, sizeof(text)) != 0)
    std::snprintf(text, sizeof(text), "errno %d", code);
#endif
  return ::megalith::detail::concat(msg, " (errno ", code, ")");
}

void throw_errno(int code, const std::string& what, const std::string& path, std::uint64_t bytes,
                 const char* where) {
  using ::megalith::detail::concat;
  using memory::format_bytes;
  const std::string msg = errno_text(code);
  if (!is_no_space(code)) {
    throw io_error(code, concat(what, " '", path, "': ", msg, " [", where, "]"));
  }
  const std::uint64_t available = free_bytes(path);
  const char* why = code == EFBIG    ? " (the process's file size limit, RLIMIT_FSIZE, or the "
                                       "largest file the filesystem holds)"
                    : code == EDQUOT ? " (the user's disk quota)"
                                     : "";
  throw disk_full(
      code,
      concat("disk full: ", what, " '", path, "': ", msg, why, "; asked for ", format_bytes(bytes),
             ", ", format_bytes(available),
             " free on its filesystem; free some space or write elsewhere [", where, "]"),
      path, bytes, available);
}

}  // namespace detail
}  // namespace megalith::io
