// SwapDir and SwapFile: see [Note: swap directory lifecycle] in megalith/io/swap_dir.h.
#include "megalith/io/swap_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <mutex>
#include <random>

#include "megalith/error.h"
#include "megalith/io/error.h"
#include "megalith/memory/bytes.h"
#include "swap_marker.h"

namespace fs = std::filesystem;

namespace megalith::io {
namespace detail {

struct SwapState {
  std::string path, id;
  std::shared_ptr<AsyncIO> io;
  int lock_fd = -1;
  pid_t owner = 0;  // only the process that made the directory removes it
  std::mutex mu;
  bool removed = false;

  // Deletes the directory (throws io_error when it cannot: not from destructors).
  void remove();
  // The last of the SwapDir and its SwapFiles is gone.
  ~SwapState() {
    try {
      remove();
    } catch (...) {  // a destructor cannot report; the directory stays, stale and detectable
    }
  }
};

namespace {

struct Registry {  // live directories, removed at exit by the process that made them
  std::mutex mu;
  std::vector<std::weak_ptr<SwapState>> live;
};

void remove_all_at_exit();

Registry& registry() {
  static Registry* r = [] {
    auto* reg = new Registry();  // leaked: used by the atexit handler
    std::atexit(remove_all_at_exit);
    return reg;
  }();
  return *r;
}

void remove_all_at_exit() {
  std::vector<std::weak_ptr<SwapState>> live;
  {
    std::lock_guard<std::mutex> lock(registry().mu);
    live.swap(registry().live);
  }
  for (auto& w : live) {
    if (auto s = w.lock()) {
      try {
        s->remove();
      } catch (...) {  // nothing to report to at exit
      }
    }
  }
}

std::string sanitize(const std::string& run_name) {
  if (run_name.empty()) return "run";
  std::string out = run_name.substr(0, 64);
  for (char& c : out) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) c = '_';
  }
  return out;
}

bool valid_file_name(const std::string& name) {
  if (name.empty() || name.size() > 128 || name == "." || name == "..") return false;
  return sanitize(name) == name;
}

std::string random_id() {
  std::random_device rd;
  const std::uint64_t v = (std::uint64_t{rd()} << 32) ^ rd() ^
                          static_cast<std::uint64_t>(std::time(nullptr)) ^
                          (static_cast<std::uint64_t>(::getpid()) << 20);
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

void SwapState::remove() {
  std::lock_guard<std::mutex> lock(mu);
  if (removed || path.empty() || owner != ::getpid()) return;
  std::error_code ec;
  fs::remove_all(path, ec);  // under the lock: nobody can take the directory for stale meanwhile
  if (lock_fd >= 0) ::close(lock_fd);
  lock_fd = -1;
  removed = true;
  if (ec) {
    throw io_error(ec.value(),
                   ::megalith::detail::concat("cannot remove the swap directory '", path,
                                              "': ", ec.message(), " [", MEGALITH_WHERE, "]"));
  }
}

}  // namespace detail

SwapDir::SwapDir(const std::string& root, const std::string& run_name, std::shared_ptr<AsyncIO> io,
                 bool clean_stale)
    : state_(std::make_shared<detail::SwapState>()) {
  using ::megalith::detail::concat;
  MEGALITH_EXPECTS(!root.empty(), invalid_argument, "SwapDir: root must name a directory");
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) detail::throw_errno(ec.value(), "cannot create the swap root", root, 0, MEGALITH_WHERE);
  if (clean_stale) detail::clean_stale_of_host(root);
  auto& s = *state_;
  s.io = io ? std::move(io) : std::make_shared<AsyncIO>();
  s.owner = ::getpid();
  for (int attempt = 0;; ++attempt) {
    const std::string id = detail::random_id();
    const std::string path = concat(root, "/", kPrefix, detail::sanitize(run_name), "-", id);
    if (::mkdir(path.c_str(), 0700) == 0) {
      s.id = id;
      s.path = path;  // ours from here: a throw below removes it (~SwapState)
      break;
    }
    if (errno != EEXIST || attempt == 8) {
      detail::throw_errno(errno, "cannot create the swap directory", path, 0, MEGALITH_WHERE);
    }
  }
  s.lock_fd = detail::create_marker(s.path, s.id, run_name);
  auto& reg = detail::registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  auto& live = reg.live;
  live.erase(std::remove_if(live.begin(), live.end(), [](const auto& w) { return w.expired(); }),
             live.end());
  live.push_back(state_);
}

SwapDir::~SwapDir() = default;

const std::string& SwapDir::path() const { return state_->path; }
const std::string& SwapDir::id() const { return state_->id; }
const std::shared_ptr<AsyncIO>& SwapDir::io() const { return state_->io; }
bool SwapDir::removed() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->removed;
}
void SwapDir::remove() { state_->remove(); }

std::shared_ptr<SwapFile> SwapDir::allocate(const std::string& name, std::uint64_t nbytes) {
  MEGALITH_EXPECTS(detail::valid_file_name(name), invalid_argument, "SwapDir.allocate: name '",
                   name, "' must be 1-128 characters of [A-Za-z0-9._-]");
  std::lock_guard<std::mutex> lock(state_->mu);
  MEGALITH_EXPECTS(!state_->removed, error, "SwapDir.allocate('", name, "'): '", state_->path,
                   "' was removed");
  const std::string path =
      ::megalith::detail::concat(state_->path, "/", state_->id, "-", name, ".swap");
  detail::reserve_file(path, nbytes);
  auto file = File::open(path, Access::read_write, state_->io->options().direct);
  return std::shared_ptr<SwapFile>(new SwapFile(state_, std::move(file), path, nbytes));
}

std::vector<std::string> SwapDir::find_stale(const std::string& root) {
  std::vector<std::string> paths;
  for (const auto& s : detail::find_stale(root)) paths.push_back(s.path);
  return paths;
}

std::vector<std::string> SwapDir::clean_stale(const std::string& root) {
  std::vector<std::string> removed;
  for (const auto& s : detail::find_stale(root)) {
    std::error_code ec;
    fs::remove_all(s.path, ec);
    if (!ec) removed.push_back(s.path);
  }
  return removed;
}

SwapFile::SwapFile(std::shared_ptr<detail::SwapState> dir, std::shared_ptr<File> file,
                   std::string path, std::uint64_t nbytes)
    : dir_(std::move(dir)), file_(std::move(file)), path_(std::move(path)), nbytes_(nbytes) {}

void SwapFile::check(const char* op, std::size_t bytes, std::uint64_t offset) const {
  MEGALITH_EXPECTS(offset <= nbytes_ && bytes <= nbytes_ - offset, invalid_argument, "SwapFile.",
                   op, ": ", bytes, " bytes at offset ", offset, " go past the end of '", path_,
                   "' (", memory::format_bytes(nbytes_), ")");
  std::lock_guard<std::mutex> lock(dir_->mu);
  MEGALITH_EXPECTS(!dir_->removed, error, "SwapFile.", op, ": '", path_,
                   "' is gone: its swap directory was removed");
}

Request SwapFile::write(const void* src, std::size_t bytes, std::uint64_t offset) {
  check("write", bytes, offset);
  return dir_->io->write(file_, offset, src, bytes);
}

Request SwapFile::read(void* dst, std::size_t bytes, std::uint64_t offset) {
  check("read", bytes, offset);
  return dir_->io->read(file_, offset, dst, bytes);
}

}  // namespace megalith::io
