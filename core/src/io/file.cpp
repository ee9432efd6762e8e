// Opening files for the engine: a buffered descriptor always, an O_DIRECT one
// where the filesystem allows it.
#include "megalith/io/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <random>

#include "megalith/error.h"
#include "megalith/io/error.h"

namespace megalith::io {
namespace {

int access_flags(Access a) {
  switch (a) {
    case Access::read:
      return O_RDONLY;
    case Access::write:
      return O_WRONLY | O_CREAT;
    case Access::read_write:
      return O_RDWR | O_CREAT;
  }
  return O_RDONLY;
}

int open_retry(const char* path, int flags, mode_t mode = 0644) {
  int fd;
  do {
    fd = ::open(path, flags | O_CLOEXEC, mode);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

/// O_DIRECT is refused at open (EINVAL: tmpfs and others) or never offered.
int open_direct(const char* path, int flags) {
#ifdef O_DIRECT
  return open_retry(path, (flags & ~(O_CREAT | O_EXCL | O_TRUNC)) | O_DIRECT);
#else
  (void)path;
  (void)flags;
  return -1;
#endif
}

std::string fd_path(int fd) {
  std::string link = "/proc/self/fd/" + std::to_string(fd);
  char target[4096];
  ssize_t n = ::readlink(link.c_str(), target, sizeof(target) - 1);
  if (n <= 0) return "fd " + std::to_string(fd);
  return std::string(target, static_cast<std::size_t>(n));
}

}  // namespace

std::shared_ptr<File> File::open(const std::string& path, Access access, bool direct) {
  std::shared_ptr<File> f(new File());
  f->path_ = path;
  const int flags = access_flags(access);
  f->buffered_fd_ = open_retry(path.c_str(), flags);
  if (f->buffered_fd_ < 0) {
    const char* what =
        access == Access::read ? "cannot open for reading" : "cannot open for writing";
    detail::throw_errno(errno, what, path, 0, MEGALITH_WHERE);
  }
  if (direct) {
    f->direct_fd_ = open_direct(path.c_str(), flags);
    f->direct_active_.store(f->direct_fd_ >= 0);
  }
  return f;
}

std::shared_ptr<File> File::adopt(int fd, bool direct) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0)
    detail::throw_errno(errno, "not an open descriptor:", fd_path(fd), 0, MEGALITH_WHERE);
  std::shared_ptr<File> f(new File());
  f->path_ = fd_path(fd);
  const std::string proc = "/proc/self/fd/" + std::to_string(fd);
  const int access = flags & O_ACCMODE;
#ifdef O_DIRECT
  if (flags & O_DIRECT) {  // the caller's fd is direct: add a buffered one for unaligned parts
    f->direct_fd_ = fd;
    f->owns_direct_ = false;
    f->direct_active_.store(true);
    f->buffered_fd_ = open_retry(proc.c_str(), access);
    if (f->buffered_fd_ < 0) {
      detail::throw_errno(errno, "cannot reopen without O_DIRECT", f->path_, 0, MEGALITH_WHERE);
    }
    return f;
  }
#endif
  f->buffered_fd_ = fd;
  f->owns_buffered_ = false;
  if (direct) {
    f->direct_fd_ = open_direct(proc.c_str(), access);
    f->direct_active_.store(f->direct_fd_ >= 0);
  }
  return f;
}

File::~File() {
  if (owns_buffered_ && buffered_fd_ >= 0) ::close(buffered_fd_);
  if (owns_direct_ && direct_fd_ >= 0) ::close(direct_fd_);
}

std::uint64_t File::size() const {
  struct stat st{};
  if (::fstat(buffered_fd_, &st) != 0) return 0;
  return static_cast<std::uint64_t>(st.st_size);
}

bool direct_io_supported(const std::string& path) {
#ifdef O_DIRECT
  struct stat st{};
  if (::stat(path.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
    int fd = open_retry(path.c_str(), O_RDONLY | O_DIRECT);
    if (fd >= 0) ::close(fd);
    return fd >= 0;
  }
  std::string dir = path;
  if (::stat(path.c_str(), &st) != 0) {  // not there yet: ask its directory
    const auto slash = path.find_last_of('/');
    dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  }
  std::random_device rd;
  const std::string probe =
      dir + "/.megalith-direct-probe-" + std::to_string(::getpid()) + "-" + std::to_string(rd());
  int fd = open_retry(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_DIRECT, 0600);
  if (fd < 0) return false;
  ::close(fd);
  ::unlink(probe.c_str());
  return true;
#else
  (void)path;
  return false;
#endif
}

}  // namespace megalith::io
