#pragma once
// One conformance suite for every memory resource. A Subject makes a fresh
// resource and says how to reach its memory from the host (memcpy for host
// tiers, cudaMemcpy for the device); run_conformance() checks alignment,
// reads and writes, zero bytes, random sizes freed in random order, the
// statistics adaptor on top, and out-of-memory errors.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "harness.h"
#include "megalith/error.h"
#include "megalith/memory/resource.h"
#include "megalith/memory/statistics_adaptor.h"

namespace megalith_memory_test {

using megalith::memory::Resource;
using Copy = std::function<void(void* dst, const void* src, std::size_t bytes)>;

struct Subject {
  std::string label;
  std::function<std::shared_ptr<Resource>()> make;
  Copy upload;                           // host -> the resource's memory
  Copy download;                         // the resource's memory -> host
  std::size_t oom_bytes;                 // a request the resource must refuse
  std::vector<std::string> oom_phrases;  // what its message must say
};

inline Copy host_copy() {
  return [](void* d, const void* s, std::size_t n) { std::memcpy(d, s, n); };
}

/// MEGALITH_TEST_SEED replays a run; otherwise a fresh seed, printed.
inline std::uint32_t test_seed() {
  static const std::uint32_t seed = [] {
    const char* env = std::getenv("MEGALITH_TEST_SEED");
    std::uint32_t s =
        env ? static_cast<std::uint32_t>(std::strtoul(env, nullptr, 10)) : std::random_device{}();
    std::printf("seed=%u (MEGALITH_TEST_SEED replays it)\n", s);
    return s;
  }();
  return seed;
}

inline std::vector<std::uint8_t> random_bytes(std::mt19937& rng, std::size_t n) {
  std::vector<std::uint8_t> v(n);
  for (auto& b : v) b = static_cast<std::uint8_t>(rng());
  return v;
}

inline bool contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return true;
  std::printf("  message \"%s\" lacks \"%s\"\n", text.c_str(), part.c_str());
  return false;
}

struct Live {
  void* p;
  std::size_t bytes, alignment;
  std::vector<std::uint8_t> data;
};

inline void check_alignment_and_data(const Subject& s, Resource& r, std::mt19937& rng) {
  for (std::size_t a = 8; a <= 4096; a *= 2) {
    for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{65539}}) {
      void* p = r.allocate(n, a);
      CHECK(p != nullptr);
      CHECK(reinterpret_cast<std::uintptr_t>(p) % a == 0);
      auto want = random_bytes(rng, n);
      std::vector<std::uint8_t> got(n);
      s.upload(p, want.data(), n);
      s.download(got.data(), p, n);
      CHECK(got == want);
      r.deallocate(p, n, a);
    }
  }
  CHECK(r.allocate(0, 256) == nullptr);
  r.deallocate(nullptr, 0, 256);
  CHECK_THROWS(r.allocate(64, 3), megalith::invalid_argument);
  CHECK_THROWS(r.allocate(64, 0), megalith::invalid_argument);
}

/// Random sizes and alignments, freed in random order while more arrive; no
/// two live allocations overlap and each keeps its bytes.
inline void check_random_churn(const Subject& s, Resource& r, std::mt19937& rng) {
  std::vector<Live> live;
  auto check_and_free = [&](std::size_t i) {
    std::vector<std::uint8_t> got(live[i].bytes);
    s.download(got.data(), live[i].p, got.size());
    CHECK(got == live[i].data);
    r.deallocate(live[i].p, live[i].bytes, live[i].alignment);
    live[i] = std::move(live.back());
    live.pop_back();
  };
  std::uniform_int_distribution<int> coin(0, 2), log_size(0, 18), log_align(0, 12);
  for (int step = 0; step < 400; ++step) {
    if (!live.empty() && coin(rng) == 0) {
      check_and_free(std::uniform_int_distribution<std::size_t>(0, live.size() - 1)(rng));
      continue;
    }
    const std::size_t n = 1 + (rng() % (std::size_t{1} << log_size(rng)));
    const std::size_t a = std::size_t{1} << log_align(rng);
    Live l{r.allocate(n, a), n, a, random_bytes(rng, n)};
    CHECK(reinterpret_cast<std::uintptr_t>(l.p) % a == 0);
    s.upload(l.p, l.data.data(), n);
    live.push_back(std::move(l));
  }
  std::vector<std::pair<std::uintptr_t, std::size_t>> spans;
  for (const Live& l : live) spans.emplace_back(reinterpret_cast<std::uintptr_t>(l.p), l.bytes);
  std::sort(spans.begin(), spans.end());
  for (std::size_t i = 1; i < spans.size(); ++i) {
    CHECK(spans[i - 1].first + spans[i - 1].second <= spans[i].first);
  }
  while (!live.empty()) {
    check_and_free(std::uniform_int_distribution<std::size_t>(0, live.size() - 1)(rng));
  }
}

inline void check_statistics(const std::shared_ptr<Resource>& r, std::mt19937& rng) {
  megalith::memory::StatisticsAdaptor stats(r);
  std::vector<std::pair<void*, std::size_t>> live;
  std::size_t current = 0, peak = 0;
  for (int i = 0; i < 50; ++i) {
    std::size_t n = 1 + rng() % 100000;
    live.emplace_back(stats.allocate(n), n);
    current += n;
    peak = std::max(peak, current);
    if (i % 3 == 2) {
      stats.deallocate(live.front().first, live.front().second);
      current -= live.front().second;
      live.erase(live.begin());
    }
  }
  CHECK(stats.current_bytes() == current);
  CHECK(stats.peak_bytes() == peak);
  CHECK(stats.allocations() == 50);
  CHECK(stats.stats().live_allocations == live.size());
  for (auto& [p, n] : live) stats.deallocate(p, n);
  CHECK(stats.current_bytes() == 0);
  CHECK(stats.peak_bytes() == peak);
  stats.reset_peak();
  CHECK(stats.peak_bytes() == 0);
  CHECK(stats.allocate(0) == nullptr);  // zero bytes never reach a resource
  CHECK(stats.allocations() == 50);
}

inline void check_out_of_memory(const Subject& s, Resource& r) {
  bool thrown = false;
  try {
    void* p = r.allocate(s.oom_bytes);
    r.deallocate(p, s.oom_bytes);
  } catch (const megalith::out_of_memory& e) {
    thrown = true;
    const std::string what = e.what();
    CHECK(contains(what, "cannot allocate"));
    CHECK(contains(what, std::to_string(s.oom_bytes) + " bytes"));
    CHECK(contains(what, " free"));
    for (const std::string& phrase : s.oom_phrases) CHECK(contains(what, phrase));
  }
  if (!thrown) std::printf("  %s: allocate(%zu) did not throw\n", s.label.c_str(), s.oom_bytes);
  CHECK(thrown);
  void* p = r.allocate(4096);  // still usable afterwards
  CHECK(p != nullptr);
  r.deallocate(p, 4096);
}

inline void run_conformance(const Subject& s) {
  std::mt19937 rng(test_seed());
  std::shared_ptr<Resource> r = s.make();
  CHECK(!r->name().empty());
  check_alignment_and_data(s, *r, rng);
  check_random_churn(s, *r, rng);
  check_statistics(s.make(), rng);
  check_out_of_memory(s, *r);
}

}  // namespace megalith_memory_test
