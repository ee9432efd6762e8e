// The async file I/O engine and swap directories (megalith::io): round trips
// at odd sizes, offsets and memory alignments in direct and buffered mode,
// many requests in flight, errors (missing file, end of file, a full disk
// through RLIMIT_FSIZE), and the swap directory's lifecycle and stale dirs.
// The engine's cases run on every backend (threads, and io_uring where the
// kernel allows it); test_async_io_uring.cpp has what only concerns the choice
// of backend and the ring.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "harness.h"
#include "io_test_support.h"
#include "megalith/io/async_io.h"
#include "megalith/io/error.h"
#include "megalith/io/swap_dir.h"
#include "megalith/memory/buffer.h"
#include "megalith/memory/host_resource.h"
#include "memory_conformance.h"

namespace io = megalith::io;
namespace mm = megalith::memory;
namespace fs = std::filesystem;
using megalith_io_test::Memory;
using megalith_io_test::TempDir;
using megalith_memory_test::contains;
using megalith_memory_test::random_bytes;
using megalith_memory_test::test_seed;

namespace {
constexpr std::size_t MiB = std::size_t{1} << 20;

/// The backends to run an engine test on: threads, and uring where this
/// process can set up a ring (said once when it cannot).
std::vector<io::Backend> backends() {
  static const std::string why = io::uring_unavailable_reason();
  static bool said = false;
  if (!why.empty() && !said) std::printf("  (uring backend not tested: %s)\n", why.c_str());
  said = true;
  if (why.empty()) return {io::Backend::threads, io::Backend::uring};
  return {io::Backend::threads};
}

std::vector<std::uint8_t> read_plain(const std::string& path, std::uint64_t off, std::size_t n) {
  std::vector<std::uint8_t> out(n);
  int fd = ::open(path.c_str(), O_RDONLY);
  ssize_t got = fd >= 0 ? ::pread(fd, out.data(), n, static_cast<off_t>(off)) : -1;
  if (fd >= 0) ::close(fd);
  if (got != static_cast<ssize_t>(n)) out.clear();
  return out;
}

void round_trips(bool direct, const std::string& dir, io::Backend backend) {
  std::mt19937 rng(test_seed());
  io::AsyncIO engine({3, MiB, direct, backend});
  CHECK(engine.backend() == backend);
  CHECK(engine.direct_io_active(dir) == (direct && io::direct_io_supported(dir)));
  const std::string path = dir + (direct ? "/direct.bin" : "/buffered.bin");
  int n = 0;
  for (std::size_t bytes : {std::size_t{1}, std::size_t{511}, std::size_t{4095}, std::size_t{4097},
                            3 * MiB + 5, 8 * MiB + 13}) {
    for (std::uint64_t offset : {std::uint64_t{0}, std::uint64_t{13}, std::uint64_t{4096},
                                 std::uint64_t{3 * 4096 + 1}, std::uint64_t{5 * MiB - 7}}) {
      for (std::size_t skew : {0, 1, 64}) {
        if (bytes > MiB && skew == 64) continue;  // enough big cases
        Memory src(bytes, skew), dst(bytes, (skew + 7) % 4096);
        auto want = random_bytes(rng, bytes);
        std::memcpy(src.p, want.data(), bytes);
        io::Request w = engine.write(path, offset, src.p, bytes);
        w.wait();
        CHECK(w.done() && w.nbytes() == bytes);
        CHECK(w.direct() == engine.direct_io_active(path));
        CHECK(read_plain(path, offset, bytes) == want);  // the bytes landed where asked
        engine.read(path, offset, dst.p, bytes).wait();
        CHECK(std::memcmp(dst.p, want.data(), bytes) == 0);
        ++n;
      }
    }
  }
  CHECK(n == 80);
}

}  // namespace

TEST(round_trips_direct) {
  TempDir d;
  if (!io::direct_io_supported(d.path)) SKIP("no O_DIRECT on " + d.path);
  for (io::Backend b : backends()) round_trips(true, d.path, b);
}

TEST(round_trips_buffered) {
  TempDir d;
  for (io::Backend b : backends()) round_trips(false, d.path, b);
}

TEST(tmpfs_falls_back_to_buffered) {
  struct stat st{};
  if (::stat("/dev/shm", &st) != 0) SKIP("no /dev/shm");
  TempDir d("/dev/shm");
  if (io::direct_io_supported(d.path)) SKIP("/dev/shm takes O_DIRECT here");
  io::AsyncIO engine;
  CHECK(!engine.direct_io_active(d.path));
  for (io::Backend b : backends()) round_trips(true, d.path, b);  // asked for direct, runs buffered
}

namespace {
void many_requests_in_flight_on(io::Backend backend) {
  TempDir d;
  std::mt19937 rng(test_seed());
  io::AsyncIO engine({4, 64 * 1024, true, backend, 8});  // a queue shallower than the blocks
  const std::string path = d.path + "/many.bin";
  constexpr int kRequests = 96;
  std::vector<std::vector<std::uint8_t>> data;
  std::vector<std::uint64_t> offsets;
  std::vector<io::Request> reqs;
  std::uint64_t at = 0;
  for (int i = 0; i < kRequests; ++i) {
    data.push_back(random_bytes(rng, 1 + rng() % (300 * 1024)));
    offsets.push_back(at);
    at += data.back().size() + rng() % 5000;
  }
  for (int i = 0; i < kRequests; ++i) {
    reqs.push_back(engine.write(path, offsets[i], data[i].data(), data[i].size()));
  }
  for (auto& r : reqs) r.wait();
  std::vector<std::vector<std::uint8_t>> back(kRequests);
  reqs.clear();
  for (int i = 0; i < kRequests; ++i) {
    back[i].resize(data[i].size());
    reqs.push_back(engine.read(path, offsets[i], back[i].data(), back[i].size()));
  }
  for (int i = 0; i < kRequests; ++i) {
    reqs[i].wait();
    CHECK(back[i] == data[i]);
  }
}
}  // namespace

TEST(many_requests_in_flight) {
  for (io::Backend b : backends()) many_requests_in_flight_on(b);
}

namespace {
void descriptors_on(io::Backend backend) {
  TempDir d;
  std::mt19937 rng(test_seed());
  io::AsyncIO engine({2, MiB, true, backend});
  const std::string path = d.path + "/fd.bin";
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT, 0600);
  CHECK(fd >= 0);
  auto want = random_bytes(rng, 3 * MiB + 5);
  engine.write(fd, 17, want.data(), want.size()).wait();
  std::vector<std::uint8_t> got(want.size());
  engine.read(fd, 17, got.data(), got.size()).wait();
  CHECK(got == want);
  ::close(fd);
  CHECK_THROWS(engine.read(fd, 0, got.data(), 1), io::io_error);  // closed: EBADF
  fd = ::open(path.c_str(), O_RDWR | O_DIRECT);  // the caller's own O_DIRECT descriptor
  if (fd < 0) return;
  auto more = random_bytes(rng, 5000);  // unaligned head and tail: buffered through a second fd
  io::Request w = engine.write(fd, 4093, more.data(), more.size());
  w.wait();
  CHECK(w.direct());
  got.resize(more.size());
  engine.read(fd, 4093, got.data(), got.size()).wait();
  CHECK(got == more && read_plain(path, 4093, more.size()) == more);
  ::close(fd);
}

void errors_name_the_file_on(io::Backend backend) {
  TempDir d;
  io::AsyncIO engine({4, MiB, true, backend});
  std::vector<char> buf(8192);
  const std::string missing = d.path + "/missing.bin";
  try {
    engine.read(missing, 0, buf.data(), buf.size()).wait();
    CHECK(false);
  } catch (const io::io_error& e) {
    CHECK(e.code() == ENOENT);
    CHECK(contains(e.what(), missing));
  }
  const std::string small = d.path + "/small.bin";
  engine.write(small, 0, buf.data(), 100).wait();
  io::Request r = engine.read(small, 0, buf.data(), buf.size());  // past the end: at wait
  CHECK_THROWS(r.wait(), io::io_error);
  try {
    r.wait();
  } catch (const io::io_error& e) {
    CHECK(contains(e.what(), "the file ends at 100 bytes"));
  }
  CHECK_THROWS(io::AsyncIO({0, MiB, true, backend}), megalith::invalid_argument);
}
}  // namespace

TEST(descriptors) {
  for (io::Backend b : backends()) descriptors_on(b);
}

TEST(errors_name_the_file) {
  for (io::Backend b : backends()) errors_name_the_file_on(b);
}

namespace {
/// Caps the size of files this process writes (RLIMIT_FSIZE) with SIGXFSZ
/// ignored, so writes past the cap fail with EFBIG instead of killing us.
struct FileSizeLimit {
  rlimit old{};
  void (*old_handler)(int);
  explicit FileSizeLimit(rlim_t bytes) {
    old_handler = std::signal(SIGXFSZ, SIG_IGN);
    ::getrlimit(RLIMIT_FSIZE, &old);
    rlimit lim = old;
    lim.rlim_cur = bytes;
    ::setrlimit(RLIMIT_FSIZE, &lim);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &old);
    std::signal(SIGXFSZ, old_handler);
  }
};

void disk_full_keeps_what_was_written_on(io::Backend backend) {
  TempDir d;
  std::mt19937 rng(test_seed());
  for (bool direct : {true, false}) {
    io::SwapDir swap(d.path, "full",
                     std::make_shared<io::AsyncIO>(io::IOOptions{2, MiB, direct, backend}));
    auto saved = random_bytes(rng, MiB + 3);
    auto first = swap.allocate("first", 2 * MiB);
    first->write(saved.data(), saved.size(), 5).wait();
    const std::string plain = swap.path() + "/plain.bin";
    swap.io()->write(plain, 0, saved.data(), saved.size()).wait();
    {
      FileSizeLimit limit(4 * MiB);
      try {  // reserving past the limit fails at allocate, naming path and bytes
        swap.allocate("second", 6 * MiB);
        CHECK(false);
      } catch (const io::disk_full& e) {
        CHECK(e.code() == EFBIG && e.bytes_requested() == 6 * MiB && e.bytes_free() > 0);
        CHECK(contains(e.what(), "second.swap'") && contains(e.what(), "(6291456 bytes)"));
        CHECK(contains(e.what(), "free on its filesystem"));
      }
      CHECK(!fs::exists(swap.path() + "/" + swap.id() + "-second.swap"));
      std::vector<std::uint8_t> more = random_bytes(rng, 5 * MiB);  // a write past it: at wait
      io::Request r = swap.io()->write(plain, saved.size(), more.data(), more.size());
      CHECK_THROWS(r.wait(), io::disk_full);
      try {
        r.wait();
      } catch (const io::disk_full& e) {
        CHECK(contains(e.what(), "disk full: cannot write 5.0 MiB") && contains(e.what(), plain) &&
              contains(e.what(), "RLIMIT_FSIZE"));
      }
    }
    std::vector<std::uint8_t> back(saved.size());
    first->read(back.data(), back.size(), 5).wait();
    CHECK(back == saved);
    CHECK(read_plain(plain, 0, saved.size()) == saved);
  }
}

void enospc_from_dev_full_on(io::Backend backend) {
  io::AsyncIO engine({4, MiB, true, backend});
  std::vector<char> buf(10000, 'x');
  io::Request r = engine.write("/dev/full", 4096, buf.data(), buf.size());
  try {
    r.wait();
    CHECK(false);
  } catch (const io::disk_full& e) {
    CHECK(e.code() == ENOSPC && e.bytes_requested() == buf.size() && e.path() == "/dev/full");
    CHECK(contains(e.what(),
                   "disk full: cannot write 9.8 KiB (10000 bytes) at offset 4096 of "
                   "'/dev/full': No space left on device"));
  }
}
}  // namespace

TEST(disk_full_keeps_what_was_written) {
  for (io::Backend b : backends()) disk_full_keeps_what_was_written_on(b);
}

TEST(enospc_from_dev_full) {
  struct stat st{};
  if (::stat("/dev/full", &st) != 0) SKIP("no /dev/full");
  for (io::Backend b : backends()) enospc_from_dev_full_on(b);
}

TEST(swap_dir_lifecycle) {
  TempDir d;
  std::mt19937 rng(test_seed());
  std::string path;
  {
    io::SwapDir swap(d.path + "/root", "my run/1");
    path = swap.path();
    CHECK(contains(path, "/root/megalith-swap-my_run_1-" + swap.id()));
    CHECK(fs::is_regular_file(path + "/megalith-swap.lock"));
    auto f = swap.allocate("opt.m", 3 * MiB + 1);
    CHECK(f->path() == path + "/" + swap.id() + "-opt.m.swap" && f->nbytes() == 3 * MiB + 1);
    CHECK(fs::file_size(f->path()) == 3 * MiB + 1);
    auto want = random_bytes(rng, 3 * MiB + 1);
    f->write(want.data(), want.size()).wait();
    std::vector<std::uint8_t> got(want.size());
    f->read(got.data(), got.size()).wait();
    CHECK(got == want);
    CHECK_THROWS(f->write(want.data(), 2, 3 * MiB), megalith::invalid_argument);
    CHECK_THROWS(swap.allocate("a/b", 1), megalith::invalid_argument);
    CHECK_THROWS(swap.allocate("opt.m", 1), io::io_error);
    CHECK(io::SwapDir::find_stale(d.path + "/root").empty());  // alive: locked
    swap.remove();
    CHECK(!fs::exists(path) && swap.removed());
    CHECK_THROWS(f->read(got.data(), 1), megalith::error);
    CHECK_THROWS(swap.allocate("x", 1), megalith::error);
  }
  std::shared_ptr<io::SwapFile> kept;
  {
    io::SwapDir other(d.path + "/root");
    path = other.path();
    kept = other.allocate("kept", 4096);
  }
  CHECK(fs::exists(kept->path()));  // a file keeps its directory
  kept.reset();
  CHECK(!fs::exists(path));  // the last owner removed it
}

TEST(stale_dirs_are_found_and_cleaned) {
  TempDir d;
  io::SwapDir live(d.path);
  std::fflush(stdout);  // or the children print what is buffered again
  pid_t child = ::fork();
  if (child == 0) {  // a "crashed" run: leaves its directory, exits without cleanup
    io::SwapDir crashed(d.path, "crashed");
    crashed.allocate("state", 4096);
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  child = ::fork();
  if (child == 0) std::exit(0);  // a forked child's normal exit must not remove `live`
  ::waitpid(child, &status, 0);
  CHECK(fs::exists(live.path()));
  fs::create_directory(d.path + "/megalith-swap-fresh-no-marker");  // too young to judge
  fs::create_directory(d.path + "/megalith-swap-foreign");
  std::FILE* f = std::fopen((d.path + "/megalith-swap-foreign/megalith-swap.lock").c_str(), "w");
  std::fputs("not ours\n", f);
  std::fclose(f);
  auto stale = io::SwapDir::find_stale(d.path);
  CHECK(stale.size() == 1 && contains(stale[0], "megalith-swap-crashed-"));
  io::SwapDir fresh(d.path, "next");  // cleans this host's stale dirs
  CHECK(!fs::exists(stale[0]));
  CHECK(io::SwapDir::find_stale(d.path).empty());
  CHECK(fs::exists(live.path()) && fs::exists(d.path + "/megalith-swap-foreign"));
}

MEGALITH_TEST_MAIN()
