// AsyncIO's backends: the choice (options, MEGALITH_IO_BACKEND, a kernel that
// refuses io_uring, faked with a seccomp filter in a child process), and what
// stresses the io_uring backend most: requests from several threads at once,
// the destructor with requests queued, short transfers at the end of a file
// read with O_DIRECT, and a request whose later blocks fail. Round trips and
// disk-full cases on both backends are in test_async_io.cpp.
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"
#include "io_test_support.h"
#include "megalith/io/async_io.h"
#include "megalith/io/error.h"
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
constexpr std::size_t KiB = 1024, MiB = std::size_t{1} << 20;

bool uring_here() { return io::uring_unavailable_reason().empty(); }

/// Sets an environment variable for a scope.
struct Env {
  const char* name;
  explicit Env(const char* n, const char* value) : name(n) { ::setenv(n, value, 1); }
  ~Env() { ::unsetenv(name); }
};
}  // namespace

TEST(backend_names) {
  CHECK(io::parse_backend("threads") == io::Backend::threads);
  CHECK(io::parse_backend("uring") == io::Backend::uring);
  CHECK(io::parse_backend("auto") == io::Backend::automatic);
  for (io::Backend b : {io::Backend::threads, io::Backend::uring, io::Backend::automatic}) {
    CHECK(io::parse_backend(io::backend_name(b)) == b);
  }
  try {
    io::parse_backend("io_uring");
    CHECK(false);
  } catch (const megalith::invalid_argument& e) {
    CHECK(contains(e.what(), "\"threads\", \"uring\" or \"auto\", got \"io_uring\""));
  }
  CHECK_THROWS(io::AsyncIO({4, MiB, true, io::Backend::threads, 0}), megalith::invalid_argument);
  CHECK_THROWS(io::AsyncIO({4, MiB, true, io::Backend::threads, 4097}), megalith::invalid_argument);
}

TEST(automatic_takes_uring_where_it_can) {
  const std::string why = io::uring_unavailable_reason();
  io::AsyncIO automatic;
  CHECK(automatic.options().backend == io::Backend::automatic);
  CHECK(automatic.backend() == (why.empty() ? io::Backend::uring : io::Backend::threads));
  CHECK(io::AsyncIO({2, MiB, true, io::Backend::threads}).backend() == io::Backend::threads);
  if (why.empty()) {
    CHECK(io::AsyncIO({2, MiB, true, io::Backend::uring}).backend() == io::Backend::uring);
  } else {
    std::printf("  io_uring here: %s\n", why.c_str());
    CHECK(contains(why, "io_uring is not available here") && contains(why, "threads"));
    CHECK_THROWS(io::AsyncIO({2, MiB, true, io::Backend::uring}), io::io_error);
  }
}

TEST(environment_overrides_automatic_only) {
  {
    Env env("MEGALITH_IO_BACKEND", "threads");
    CHECK(io::AsyncIO().backend() == io::Backend::threads);
    if (uring_here()) {  // a backend asked for by name wins over the environment
      CHECK(io::AsyncIO({2, MiB, true, io::Backend::uring}).backend() == io::Backend::uring);
    }
  }
  {
    Env env("MEGALITH_IO_BACKEND", "uring");
    if (uring_here()) {
      CHECK(io::AsyncIO().backend() == io::Backend::uring);
    } else {
      CHECK_THROWS(io::AsyncIO(), io::io_error);
    }
  }
  {
    Env env("MEGALITH_IO_BACKEND", "fast");
    try {
      io::AsyncIO bad;
      CHECK(false);
    } catch (const megalith::invalid_argument& e) {
      CHECK(contains(e.what(), "MEGALITH_IO_BACKEND must be threads, uring or auto, got 'fast'"));
    }
    CHECK(io::AsyncIO({2, MiB, true, io::Backend::threads}).backend() == io::Backend::threads);
  }
}

// A child process where io_uring_setup fails with EPERM, as under a container
// runtime's seccomp profile or with kernel.io_uring_disabled = 2.
TEST(refused_io_uring_falls_back_or_says_why) {
  if (contains(io::uring_unavailable_reason(), "built without"))
    SKIP("this build has no io_uring backend to refuse");
  std::fflush(stdout);
  const pid_t child = ::fork();
  if (child == 0) {
    sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    sock_fprog prog{static_cast<unsigned short>(sizeof(filter) / sizeof(filter[0])), filter};
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) {
      ::_exit(megalith_test::kSkipped);
    }
    const std::string why = io::uring_unavailable_reason();
    CHECK(contains(why, "io_uring_setup failed: Operation not permitted (errno 1)"));
    io::AsyncIO automatic;
    CHECK(automatic.backend() == io::Backend::threads);
    try {
      io::AsyncIO({2, MiB, true, io::Backend::uring});
      CHECK(false);
    } catch (const io::io_error& e) {
      CHECK(e.code() == EPERM);
      CHECK(contains(e.what(), "Operation not permitted") &&
            contains(e.what(), "MEGALITH_IO_BACKEND=threads") &&
            contains(e.what(), "backend=\"threads\""));
    }
    TempDir d;
    std::vector<char> out(5000, 'u'), back(5000);
    automatic.write(d.path + "/f.bin", 3, out.data(), out.size()).wait();
    automatic.read(d.path + "/f.bin", 3, back.data(), back.size()).wait();
    CHECK(out == back);
    std::fflush(stdout);
    ::_exit(megalith_test::failures() == 0 ? 0 : 1);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  CHECK(WIFEXITED(status));
  if (WEXITSTATUS(status) == megalith_test::kSkipped) SKIP("no seccomp filters here");
  CHECK(WEXITSTATUS(status) == 0);
}

namespace {
io::IOOptions uring_options(int threads, std::size_t block, bool direct, int depth) {
  if (!uring_here()) SKIP(io::uring_unavailable_reason());
  return {threads, block, direct, io::Backend::uring, depth};
}
}  // namespace

TEST(requests_from_several_threads) {
  TempDir d;
  for (bool direct : {true, false}) {
    io::AsyncIO engine(uring_options(2, 64 * KiB, direct, 16));
    const std::string shared = d.path + (direct ? "/shared-direct.bin" : "/shared.bin");
    constexpr int kThreads = 6, kRounds = 25;
    constexpr std::uint64_t kRegion = 4 * MiB;  // each thread's part of the shared file
    std::vector<int> bad(kThreads, 0);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        std::mt19937 rng(test_seed() + static_cast<unsigned>(t));
        const std::string own = d.path + "/own-" + std::to_string(t) + ".bin";
        for (int i = 0; i < kRounds; ++i) {
          // Aligned and odd sizes, offsets and memory: ring and thread-pool blocks mixed.
          const bool even = rng() % 2 == 0;
          const std::size_t bytes = even ? (1 + rng() % 64) * 4096 : 1 + rng() % (600 * KiB);
          const std::uint64_t off = (even ? rng() % 256 * 4096 : rng() % (3 * MiB)) % MiB;
          Memory src(bytes, even ? 0 : rng() % 4096), dst(bytes, even ? 0 : rng() % 4096);
          auto want = random_bytes(rng, bytes);
          std::memcpy(src.p, want.data(), bytes);
          const std::string& path = i % 2 ? own : shared;
          const std::uint64_t at = i % 2 ? off : t * kRegion + off;
          io::Request w = engine.write(path, at, src.p, bytes);
          w.wait();
          engine.read(path, at, dst.p, bytes).wait();
          if (std::memcmp(dst.p, want.data(), bytes) != 0) ++bad[t];
        }
      });
    }
    for (auto& th : threads) th.join();
    for (int t = 0; t < kThreads; ++t) CHECK(bad[t] == 0);
  }
}

TEST(destructor_finishes_requests_in_flight) {
  TempDir d;
  std::mt19937 rng(test_seed());
  constexpr int kRequests = 48;
  constexpr std::size_t kBytes = 200 * KiB + 7;
  std::vector<std::vector<std::uint8_t>> data;
  for (int i = 0; i < kRequests; ++i) data.push_back(random_bytes(rng, kBytes));
  const std::string path = d.path + "/dtor.bin";
  std::vector<io::Request> reqs;
  {
    io::AsyncIO engine(uring_options(2, 64 * KiB, true, 4));
    for (int i = 0; i < kRequests; ++i) {
      reqs.push_back(engine.write(path, i * kBytes, data[i].data(), kBytes));
    }
  }  // most are still queued here
  for (auto& r : reqs) CHECK(r.done());
  for (auto& r : reqs) r.wait();
  std::vector<std::vector<std::uint8_t>> back(kRequests, std::vector<std::uint8_t>(kBytes));
  reqs.clear();
  {
    io::AsyncIO engine(uring_options(2, 64 * KiB, true, 4));
    for (int i = 0; i < kRequests; ++i) {
      reqs.push_back(engine.read(path, i * kBytes, back[i].data(), kBytes));
    }
  }
  for (int i = 0; i < kRequests; ++i) {
    CHECK(reqs[i].done());
    reqs[i].wait();
    CHECK(back[i] == data[i]);
  }
}

TEST(direct_reads_at_the_end_of_the_file) {
  TempDir d;
  std::mt19937 rng(test_seed());
  io::AsyncIO engine(uring_options(2, 4 * KiB, true, 8));
  const std::string path = d.path + "/end.bin";
  auto want = random_bytes(rng, 10000);
  engine.write(path, 0, want.data(), want.size()).wait();
  Memory m(16 * KiB, 0);  // aligned: every block goes through the ring
  engine.read(path, 0, m.p, 8192).wait();
  CHECK(std::memcmp(m.p, want.data(), 8192) == 0);
  // A direct read of 4096 at 8192 gets 1808 bytes, then the end of the file.
  io::Request r = engine.read(path, 8192, m.p, 4096);
  try {
    r.wait();
    CHECK(false);
  } catch (const io::io_error& e) {
    CHECK(e.code() == 0 && contains(e.what(), "the file ends at 10000 bytes"));
    CHECK(contains(e.what(), "cannot read 4.0 KiB (4096 bytes) at offset 8192"));
  }
  // Four blocks, the last two past the end: the request's first error is kept.
  r = engine.read(path, 0, m.p, 16 * KiB);
  CHECK_THROWS(r.wait(), io::io_error);
  try {
    r.wait();
  } catch (const io::io_error& e) {
    CHECK(contains(e.what(), "at offset 0 from '" + path + "': the file ends at 10000 bytes"));
  }
  CHECK(r.done());
  // Within the file, an unaligned file size is fine: the short direct read is finished buffered.
  std::vector<std::uint8_t> tail(10000 - 4096);
  engine.read(path, 4096, tail.data(), tail.size()).wait();
  CHECK(std::equal(tail.begin(), tail.end(), want.begin() + 4096));
}

MEGALITH_TEST_MAIN()
