// Chunk placement, the capacity search (hand-checked cases, brute force on
// small inputs, invariants on 10k tensors), and chunks moving between the
// host tiers with their statistics.
#include <chrono>
#include <cstring>
#include <string>

#include "harness.h"
#include "megalith/error.h"
#include "megalith/memory/capacity_search.h"
#include "megalith/memory/chunk_store.h"
#include "megalith/memory/host_resource.h"
#include "megalith/memory/limiting_adaptor.h"
#include "memory_conformance.h"

namespace mm = megalith::memory;
using megalith_memory_test::contains;
using megalith_memory_test::random_bytes;
using megalith_memory_test::test_seed;
using Sizes = std::vector<std::size_t>;

namespace {

/// Pageable memory that calls itself pinned: lets a CPU-only build move
/// chunks between two host tiers (the plain-memcpy path).
class FakePinned final : public mm::Resource {
 public:
  mm::Tier tier() const override { return mm::Tier::pinned_host; }
  std::string name() const override { return "fake_pinned"; }

 private:
  void* do_allocate(std::size_t n, std::size_t a) override { return host_.allocate(n, a); }
  void do_deallocate(void* p, std::size_t n, std::size_t a) noexcept override {
    host_.deallocate(p, n, a);
  }
  mm::HostResource host_;
};

std::shared_ptr<mm::Resource> host() { return std::make_shared<mm::HostResource>(); }

/// The placement rule, step by step, with no prefix-sum tricks.
std::size_t simulate(const Sizes& s, std::size_t cap, std::size_t align) {
  std::size_t chunks = 0, used = 0;
  for (std::size_t n : s) {
    std::size_t off = mm::align_up(used, align);
    if (chunks == 0 || off + n > cap) {
      ++chunks;
      off = 0;
    }
    used = off + n;
  }
  return chunks;
}

mm::CapacityChoice brute_force(const Sizes& s, std::size_t lo, std::size_t hi, std::size_t align) {
  std::size_t total = 0, big = 1;
  for (std::size_t n : s) {
    total += n;
    big = std::max(big, n);
  }
  mm::CapacityChoice best{0, ~std::size_t{0}, 0};
  for (std::size_t c = std::max(lo, big); c <= hi; ++c) {
    std::size_t k = simulate(s, c, align), waste = k * c - total;
    if (waste < best.wasted_bytes)
      best = {c, waste, k};
    else if (waste == best.wasted_bytes && k < best.chunks)
      best = {c, waste, k};
  }
  return best;
}

bool same(const mm::CapacityChoice& a, const mm::CapacityChoice& b) {
  return a.capacity == b.capacity && a.wasted_bytes == b.wasted_bytes && a.chunks == b.chunks;
}

}  // namespace

TEST(place_aligns_offsets_and_refuses_overflow) {
  mm::ChunkStore store(1000, {host(), nullptr, nullptr}, 256);
  auto c = store.new_chunk(mm::Tier::host);
  CHECK(c->id() == 0);
  CHECK(c->capacity() == 1000);
  CHECK(c->place(100) == 0);
  CHECK(c->place(10) == 256);
  CHECK(c->used_bytes() == 266);
  CHECK(c->place(300, 64) == 320);
  CHECK(!c->fits(400));
  CHECK(c->fits(232));
  CHECK(c->place(232) == 768);
  CHECK(c->used_bytes() == 1000);
  CHECK(!c->fits(0));
  try {
    c->place(1);
    CHECK(false);
  } catch (const megalith::invalid_argument& e) {
    CHECK(contains(e.what(), "chunk 0"));
    CHECK(contains(e.what(), "capacity 1000 bytes"));
    CHECK(contains(e.what(), "1000 bytes used"));
  }
  CHECK_THROWS(c->place(8, 512), megalith::invalid_argument);  // beyond the storage alignment
  CHECK(reinterpret_cast<std::uintptr_t>(c->data()) % 256 == 0);
  CHECK(store.new_chunk(mm::Tier::host)->id() == 1);
}

TEST(capacity_search_hand_checked) {
  // Equal waste (none) at 100 and 300: fewer chunks wins.
  auto r = mm::search_chunk_capacity({100, 100, 100}, 1, 1000, 1);
  CHECK(r.capacity == 300 && r.wasted_bytes == 0 && r.chunks == 1);
  // 3 chunks at 60 and 2 at 90 both allocate 180: 90.
  r = mm::search_chunk_capacity({60, 50, 40}, 1, 100, 1);
  CHECK(r.capacity == 90 && r.wasted_bytes == 30 && r.chunks == 2);
  // Alignment padding counts: packing three 10-byte tensors at 16 wastes 12.
  r = mm::search_chunk_capacity({10, 10, 10}, 1, 100, 16);
  CHECK(r.capacity == 10 && r.wasted_bytes == 0 && r.chunks == 3);
  r = mm::search_chunk_capacity({10, 10, 10}, 40, 100, 16);
  CHECK(r.capacity == 42 && r.wasted_bytes == 12 && r.chunks == 1);
  r = mm::search_chunk_capacity({10, 10, 10}, 50, 100, 16);
  CHECK(r.capacity == 50 && r.wasted_bytes == 20 && r.chunks == 1);
  r = mm::search_chunk_capacity({}, 64, 128, 16);
  CHECK(r.capacity == 64 && r.wasted_bytes == 0 && r.chunks == 0);
  try {
    mm::search_chunk_capacity({10, 500, 20}, 1, 100, 1);
    CHECK(false);
  } catch (const megalith::invalid_argument& e) {
    CHECK(contains(e.what(), "tensor 1 has 500 bytes"));
    CHECK(contains(e.what(), "max_capacity is 100 bytes"));
  }
  CHECK_THROWS(mm::search_chunk_capacity({10}, 200, 100, 1), megalith::invalid_argument);
  CHECK_THROWS(mm::search_chunk_capacity({10}, 1, 100, 3), megalith::invalid_argument);
  CHECK(mm::count_chunks({60, 50, 40}, 90, 1) == 2);
}

TEST(capacity_search_matches_brute_force) {
  std::mt19937 rng(test_seed());
  int mismatches = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    Sizes s(1 + rng() % 12);
    const std::size_t top = 1 + rng() % 300;
    for (auto& n : s) n = rng() % 7 == 0 ? 0 : rng() % (top + 1);
    const std::size_t align = std::size_t{1} << (rng() % 7);
    const std::size_t lo = rng() % 200,
                      hi = *std::max_element(s.begin(), s.end()) + lo + rng() % 600;
    auto want = brute_force(s, lo, hi, align);
    auto got = mm::search_chunk_capacity(s, lo, hi, align);
    if (!same(got, want) && mismatches++ < 5) {
      std::printf("  trial %d: got (%zu, %zu, %zu), brute force (%zu, %zu, %zu)\n", trial,
                  got.capacity, got.wasted_bytes, got.chunks, want.capacity, want.wasted_bytes,
                  want.chunks);
    }
    CHECK(simulate(s, got.capacity, align) == mm::count_chunks(s, got.capacity, align));
  }
  CHECK(mismatches == 0);
}

TEST(capacity_search_10k_tensors) {
  std::mt19937 rng(test_seed());
  constexpr std::size_t MiB = std::size_t{1} << 20;
  for (int shape = 0; shape < 3; ++shape) {
    Sizes s(10000);
    for (std::size_t i = 0; i < s.size(); ++i) {
      if (shape == 0) s[i] = 1 + rng() % (4 * MiB);                     // uniform
      if (shape == 1) s[i] = i % 10 == 0 ? 4 * MiB : 1 + rng() % 8192;  // GPT-like: big + small
      if (shape == 2) s[i] = 2 * MiB;                                   // all equal
    }
    std::size_t total = 0;
    for (std::size_t n : s) total += n;
    auto t0 = std::chrono::steady_clock::now();
    auto r = mm::search_chunk_capacity(s, 0, 1024 * MiB, 256);
    double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::printf("  shape %d: capacity %zu, %zu chunks, waste %zu (%.3f%%) in %.1f ms\n", shape,
                r.capacity, r.chunks, r.wasted_bytes, 100.0 * r.wasted_bytes / total, ms);
    CHECK(r.chunks == mm::count_chunks(s, r.capacity, 256));
    CHECK(r.wasted_bytes == r.chunks * r.capacity - total);
    for (int probe = 0; probe < 200; ++probe) {  // no other capacity wastes less
      std::size_t c = 4 * MiB + rng() % (1020 * MiB);
      std::size_t k = mm::count_chunks(s, c, 256);
      CHECK(k * c - total >= r.wasted_bytes);
    }
    if (shape == 2) CHECK(r.wasted_bytes == 0);
  }
}

TEST(move_between_host_tiers_keeps_bytes_and_updates_stats) {
  std::mt19937 rng(test_seed());
  mm::ChunkStore store(4096 + 17, {host(), std::make_shared<FakePinned>(), nullptr});
  auto c = store.new_chunk(mm::Tier::host);
  auto bytes = random_bytes(rng, c->capacity());
  std::memcpy(c->data(), bytes.data(), bytes.size());
  c->move_to(mm::Tier::pinned_host);
  CHECK(c->tier() == mm::Tier::pinned_host);
  CHECK(store.stats(mm::Tier::host).current_bytes == 0);
  CHECK(store.stats(mm::Tier::host).peak_bytes == c->capacity());
  CHECK(store.stats(mm::Tier::pinned_host).current_bytes == c->capacity());
  CHECK(std::memcmp(c->data(), bytes.data(), bytes.size()) == 0);
  c->move_to(mm::Tier::host);
  c->synchronize();
  CHECK(std::memcmp(c->data(), bytes.data(), bytes.size()) == 0);
  c->move_to(mm::Tier::host);  // already there: nothing happens
  CHECK(store.stats(mm::Tier::host).allocations == 2);
}

TEST(release_and_allocate_change_stats) {
  mm::ChunkStore store(1 << 16, {host(), nullptr, nullptr});
  auto a = store.new_chunk(mm::Tier::host);
  auto b = store.new_chunk(mm::Tier::host);
  a->place(1000);
  CHECK(store.stats(mm::Tier::host).current_bytes == 2u << 16);
  a->release();
  CHECK(!a->resident());
  CHECK(a->data() == nullptr);
  CHECK(a->used_bytes() == 1000);  // placement survives
  CHECK(store.stats(mm::Tier::host).current_bytes == 1u << 16);
  CHECK(store.stats(mm::Tier::host).peak_bytes == 2u << 16);
  CHECK_THROWS(a->move_to(mm::Tier::host), megalith::invalid_argument);
  store.reset_peak();
  CHECK(store.stats(mm::Tier::host).peak_bytes == 1u << 16);
  a->allocate(mm::Tier::host);
  CHECK(a->resident());
  CHECK(store.stats(mm::Tier::host).current_bytes == 2u << 16);
  CHECK_THROWS(a->allocate(mm::Tier::host), megalith::invalid_argument);
  CHECK(store.stats(mm::Tier::device).current_bytes == 0);  // no resource: zeros
  b.reset();
  CHECK(store.stats(mm::Tier::host).current_bytes == 1u << 16);
}

TEST(store_errors_name_the_problem) {
  mm::ChunkStore store(1024, {host(), nullptr, nullptr});
  try {
    store.new_chunk(mm::Tier::device);
    CHECK(false);
  } catch (const megalith::invalid_argument& e) {
    CHECK(contains(e.what(), "no resource for tier device: pass device="));
  }
  CHECK_THROWS(mm::ChunkStore(1024, {nullptr, nullptr, host()}), megalith::invalid_argument);
  CHECK_THROWS(mm::ChunkStore(0, {host(), nullptr, nullptr}), megalith::invalid_argument);
  auto limited = std::make_shared<mm::LimitingAdaptor>(host(), 2048);
  mm::ChunkStore small(1024, {limited, nullptr, nullptr});
  auto c0 = small.new_chunk(mm::Tier::host);
  auto c1 = small.new_chunk(mm::Tier::host);
  try {
    small.new_chunk(mm::Tier::host);
    CHECK(false);
  } catch (const megalith::out_of_memory& e) {
    CHECK(contains(e.what(), "chunk 2 (capacity 1.0 KiB (1024 bytes)) on tier host"));
    CHECK(contains(e.what(), "0 bytes free"));
  }
}

TEST(chunk_outlives_its_store) {
  std::shared_ptr<mm::Chunk> c;
  auto stats = std::make_shared<mm::StatisticsAdaptor>(host());
  {
    mm::ChunkStore store(4096, {stats, nullptr, nullptr});
    c = store.new_chunk(mm::Tier::host);
  }
  CHECK(stats->current_bytes() == 4096);
  c->release();
  CHECK(stats->current_bytes() == 0);
}

MEGALITH_TEST_MAIN()
