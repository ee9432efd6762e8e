// The resource conformance suite on the host resources and adaptors, plus
// what is particular to the pool and the adaptors. GPU resources:
// test_memory_resources_gpu.cpp.
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "megalith/memory/buffer.h"
#include "megalith/memory/host_resource.h"
#include "megalith/memory/limiting_adaptor.h"
#include "megalith/memory/pool_resource.h"
#include "memory_conformance.h"

namespace mm = megalith::memory;
using megalith_memory_test::contains;
using megalith_memory_test::host_copy;
using megalith_memory_test::run_conformance;
using megalith_memory_test::Subject;

namespace {
constexpr std::size_t MiB = std::size_t{1} << 20;
std::shared_ptr<mm::Resource> host() { return std::make_shared<mm::HostResource>(); }
}  // namespace

TEST(host_conforms) {
  run_conformance(
      {"host", host, host_copy(), host_copy(), std::size_t{1} << 50, {"'host'", "1.0 PiB"}});
}

#if defined(__linux__)
namespace {
// The VmFlags line of the /proc/self/smaps entry whose range holds `p` ("" if none).
std::string vm_flags_of(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    std::uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-') {
      inside = lo <= addr && addr < hi;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}
}  // namespace

TEST(host_large_blocks_are_huge_page_aligned_and_advised) {
  mm::HostResource res;
  const std::size_t bytes = 9 * mm::HostResource::kHugePageBytes + 12345;
  void* p = res.allocate(bytes, 64);
  CHECK(reinterpret_cast<std::uintptr_t>(p) % mm::HostResource::kHugePageBytes == 0);
  std::string thp;
  std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled") >> thp;
  const std::string flags = vm_flags_of(p);
  res.deallocate(p, bytes, 64);
  if (thp.empty() || flags.empty()) SKIP("no transparent huge pages or smaps here");
  CHECK(flags.find(" hg") != std::string::npos);  // MADV_HUGEPAGE took
  void* small = res.allocate(4096, 64);  // small blocks stay with the C library as they were
  res.deallocate(small, 4096, 64);
}
#endif

TEST(pool_host_conforms) {
  run_conformance({"pool(host)",
                   [] { return std::make_shared<mm::PoolResource>(host(), MiB, 64 * MiB); },
                   host_copy(),
                   host_copy(),
                   128 * MiB,
                   {"pool(host)", "max_bytes 64.0 MiB (67108864 bytes)", "in use"}});
}

TEST(unlimited_pool_host_conforms) {
  run_conformance({"pool(host) without max_bytes",
                   [] { return std::make_shared<mm::PoolResource>(host(), MiB); },
                   host_copy(),
                   host_copy(),
                   std::size_t{1} << 50,
                   {"upstream: cannot allocate"}});
}

TEST(stats_host_conforms) {
  run_conformance({"stats(host)",
                   [] { return std::make_shared<mm::StatisticsAdaptor>(host()); },
                   host_copy(),
                   host_copy(),
                   std::size_t{1} << 50,
                   {"'host'"}});
}

TEST(limiting_host_conforms) {
  run_conformance(
      {"limit(host)",
       [] { return std::make_shared<mm::LimitingAdaptor>(host(), 64 * MiB); },
       host_copy(),
       host_copy(),
       64 * MiB + 1,
       {"limit 64.0 MiB (67108864 bytes)", "0 bytes in use", "64.0 MiB (67108864 bytes) free"}});
}

TEST(format_bytes_reads_well) {
  CHECK(mm::format_bytes(0) == "0 bytes");
  CHECK(mm::format_bytes(1023) == "1023 bytes");
  CHECK(mm::format_bytes(1536) == "1.5 KiB (1536 bytes)");
  CHECK(mm::format_bytes(64 * MiB) == "64.0 MiB (67108864 bytes)");
  CHECK(std::string(mm::tier_name(mm::Tier::pinned_host)) == "pinned_host");
}

TEST(pool_reuses_and_coalesces) {
  auto upstream = std::make_shared<mm::StatisticsAdaptor>(host());
  auto pool = std::make_shared<mm::PoolResource>(upstream, MiB);
  void* a = pool->allocate(1000);
  void* b = pool->allocate(1000);
  void* c = pool->allocate(1000);
  CHECK(upstream->allocations() == 1);  // one block serves all three
  CHECK(pool->held_bytes() == MiB);
  CHECK(pool->used_bytes() == 3 * 1024);  // 256-byte granules
  pool->deallocate(b, 1000);
  CHECK(pool->allocate(900) == b);  // best fit: the hole b left
  pool->deallocate(b, 900);
  pool->deallocate(a, 1000);
  pool->deallocate(c, 1000);
  CHECK(pool->used_bytes() == 0);
  // All three merged back with the rest of the block: the whole block fits again.
  void* whole = pool->allocate(MiB);
  CHECK(whole == a);
  CHECK(upstream->allocations() == 1);
  pool->deallocate(whole, MiB);
  void* big = pool->allocate(3 * MiB);  // larger than a block: a block of its own
  CHECK(upstream->allocations() == 2);
  CHECK(pool->held_bytes() == 4 * MiB);
  pool->deallocate(big, 3 * MiB);
  CHECK(pool->release_unused() == 4 * MiB);
  CHECK(upstream->current_bytes() == 0);
}

TEST(pool_releases_free_blocks_when_capped) {
  auto pool = std::make_shared<mm::PoolResource>(host(), 4 * MiB, 6 * MiB);
  void* p = pool->allocate(MiB);
  pool->deallocate(p, MiB);           // a free 4 MiB block stays held
  void* q = pool->allocate(5 * MiB);  // needs the free block given back first
  CHECK(q != nullptr);
  CHECK(pool->held_bytes() == 5 * MiB);
  pool->deallocate(q, 5 * MiB);
}

TEST(limiting_counts_and_refuses) {
  auto lim = std::make_shared<mm::LimitingAdaptor>(host(), 10000);
  void* a = lim->allocate(6000);
  CHECK(lim->used_bytes() == 6000);
  try {
    lim->allocate(5000);
    CHECK(false);
  } catch (const megalith::out_of_memory& e) {
    CHECK(contains(e.what(), "cannot allocate 4.9 KiB (5000 bytes) from 'limit(host)' (host)"));
    CHECK(contains(e.what(), "3.9 KiB (4000 bytes) free"));
    CHECK(contains(e.what(), "5.9 KiB (6000 bytes) in use"));
  }
  CHECK(lim->used_bytes() == 6000);
  lim->deallocate(a, 6000);
  CHECK(lim->used_bytes() == 0);
}

TEST(statistics_are_thread_safe) {
  auto stats =
      std::make_shared<mm::StatisticsAdaptor>(std::make_shared<mm::PoolResource>(host(), MiB));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&stats, t] {
      for (int i = 0; i < 500; ++i) {
        std::size_t n = 64 + 64 * ((i * 7 + t) % 50);
        void* p = stats->allocate(n);
        static_cast<char*>(p)[n - 1] = 1;
        stats->deallocate(p, n);
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(stats->current_bytes() == 0);
  CHECK(stats->allocations() == 2000);
  CHECK(stats->peak_bytes() >= 3200);
}

TEST(buffer_frees_when_last_reference_dies) {
  auto stats = std::make_shared<mm::StatisticsAdaptor>(host());
  std::shared_ptr<mm::Buffer> keep;
  {
    auto buf = mm::Buffer::allocate(stats, 4096, 512);
    CHECK(buf->nbytes() == 4096);
    CHECK(buf->tier() == mm::Tier::host);
    CHECK(buf->device() == -1);
    CHECK(reinterpret_cast<std::uintptr_t>(buf->data()) % 512 == 0);
    keep = buf;
  }
  CHECK(stats->current_bytes() == 4096);
  keep.reset();
  CHECK(stats->current_bytes() == 0);
  CHECK_THROWS(mm::Buffer::allocate(nullptr, 16), megalith::invalid_argument);
  CHECK_THROWS(mm::PoolResource(nullptr), megalith::invalid_argument);
}

MEGALITH_TEST_MAIN()
