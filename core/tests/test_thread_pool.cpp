#include <atomic>
#include <stdexcept>
#include <vector>

#include "harness.h"
#include "megalith/cpu/thread_pool.h"
#include "megalith/error.h"

using namespace megalith::cpu;

TEST(every_task_runs_once) {
  for (int threads : {1, 2, 3, 8}) {
    set_num_threads(threads);
    for (int tasks : {0, 1, 2, 5, 64}) {
      std::vector<std::atomic<int>> hits(tasks);
      parallel_for(tasks, [&](int t) { hits[t].fetch_add(1); });
      for (auto& h : hits) CHECK(h.load() == 1);
    }
  }
}

TEST(exception_propagates_and_pool_survives) {
  set_num_threads(4);
  bool caught = false;
  try {
    parallel_for(16, [](int t) {
      if (t == 7) throw std::runtime_error("task 7");
    });
  } catch (const std::runtime_error& e) {
    caught = std::string(e.what()) == "task 7";
  }
  CHECK(caught);
  std::atomic<int> sum{0};
  parallel_for(10, [&](int t) { sum += t; });
  CHECK(sum.load() == 45);
}

TEST(bad_thread_count_rejected) { CHECK_THROWS(set_num_threads(0), megalith::invalid_argument); }

MEGALITH_TEST_MAIN()
