// Marker files, stale swap directories and reserved files (swap_marker.h).
#include "swap_marker.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>
#include <filesystem>

#include "megalith/error.h"
#include "megalith/io/error.h"
#include "megalith/io/swap_dir.h"

namespace megalith::io::detail {
namespace {

using ::megalith::detail::concat;

std::string host_name() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

bool starts_with(const std::string& s, const char* prefix) {
  return s.compare(0, std::char_traits<char>::length(prefix), prefix) == 0;
}

/// The marker's text when its lock could be taken (the owner is gone), with
/// `locked` false when someone holds it or the filesystem has no flock.
std::string read_if_unlocked(const std::string& marker, bool& unlocked) {
  unlocked = false;
  int fd = ::open(marker.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  std::string text;
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
    unlocked = true;
    char buf[1024];
    ssize_t n = ::pread(fd, buf, sizeof(buf), 0);
    if (n > 0) text.assign(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);  // drops the lock, if taken
  return text;
}

std::string field(const std::string& text, const char* key) {
  const std::string k = concat("\n", key, "=");
  auto at = text.find(k);
  if (at == std::string::npos) return {};
  at += k.size();
  return text.substr(at, text.find('\n', at) - at);
}

}  // namespace

int create_marker(const std::string& dir, const std::string& id, const std::string& run_name) {
  const std::string marker = concat(dir, "/", SwapDir::kMarker);
  int fd = ::open(marker.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) throw_errno(errno, "cannot create the swap marker", marker, 0, MEGALITH_WHERE);
  // Blocking: a scanner may hold it for a moment (it then reads an empty marker: not stale).
  // A filesystem without flock leaves the directory looking alive forever: never cleaned
  // automatically, which is the safe side.
  while (::flock(fd, LOCK_EX) != 0 && errno == EINTR) {
  }
  const std::string text =
      concat(kMarkerMagic, "\nid=", id, "\npid=", ::getpid(), "\nhost=", host_name(),
             "\nrun=", run_name, "\ncreated=", static_cast<long long>(std::time(nullptr)), "\n");
  if (::pwrite(fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
    const int code = errno;
    ::close(fd);
    throw_errno(code, "cannot write the swap marker", marker, text.size(), MEGALITH_WHERE);
  }
  return fd;
}

std::vector<StaleDir> find_stale(const std::string& root) {
  std::vector<StaleDir> out;
  DIR* d = ::opendir(root.c_str());
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (!starts_with(name, SwapDir::kPrefix)) continue;
    const std::string path = concat(root, "/", name);
    struct stat st{};
    if (::lstat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) continue;
    const std::string marker = concat(path, "/", SwapDir::kMarker);
    struct stat ms{};
    if (::lstat(marker.c_str(), &ms) != 0) {
      if (errno == ENOENT && std::time(nullptr) - st.st_mtime > 60) out.push_back({path, ""});
      continue;
    }
    bool unlocked = false;
    const std::string text = read_if_unlocked(marker, unlocked);
    if (unlocked && starts_with(text, kMarkerMagic)) out.push_back({path, field(text, "host")});
  }
  ::closedir(d);
  return out;
}

void clean_stale_of_host(const std::string& root) {
  const std::string me = host_name();
  for (const auto& s : find_stale(root)) {
    if (s.host != me) continue;
    std::error_code ec;
    std::filesystem::remove_all(s.path, ec);  // best effort: a leftover is only disk space
  }
}

void reserve_file(const std::string& path, std::uint64_t nbytes) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    const char* what = errno == EEXIST ? "cannot allocate (the name is taken)" : "cannot create";
    throw_errno(errno, what, path, nbytes, MEGALITH_WHERE);
  }
  int rc = 0;
  if (nbytes > 0) {
    rc = ::posix_fallocate(fd, 0, static_cast<off_t>(nbytes));
    if (rc == EOPNOTSUPP || rc == EINVAL)
      rc = ::ftruncate(fd, static_cast<off_t>(nbytes)) == 0 ? 0 : errno;
  }
  ::close(fd);
  if (rc != 0) {
    ::unlink(path.c_str());  // nothing half-reserved stays behind
    throw_errno(rc, "cannot allocate", path, nbytes, MEGALITH_WHERE);
  }
}

}  // namespace megalith::io::detail
