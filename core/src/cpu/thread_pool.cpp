#include "megalith/cpu/thread_pool.h"

#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "megalith/error.h"

namespace megalith::cpu {
namespace {

int env_threads(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return 0;
  int n = std::atoi(v);
  return n > 0 ? n : 0;
}

int default_threads() {
  if (int n = env_threads("MEGALITH_NUM_THREADS")) return n;
  if (int n = env_threads("OMP_NUM_THREADS")) return n;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  unsigned hw = std::thread::hardware_concurrency();
  return hw ? static_cast<int>(hw) : 1;
}

// Workers sleep on a condition variable between calls; each call bumps
// `generation_`, workers and the caller pull task indices from `next_`.
class Pool {
 public:
  Pool() { pthread_atfork(nullptr, nullptr, &Pool::after_fork_in_child); }
  ~Pool() { stop_workers(); }

  int threads() {
    int n = wanted_.load();
    if (n == 0) {
      n = default_threads();
      wanted_.store(n);
    }
    return n;
  }
  void set_threads(int n) { wanted_.store(n); }

  void run(int tasks, const std::function<void(int)>& body) {
    if (tasks <= 0) return;
    std::lock_guard<std::mutex> serial(call_mu_);
    int want_workers = threads() - 1;
    if (tasks == 1 || want_workers == 0) {
      for (int t = 0; t < tasks; ++t) body(t);
      return;
    }
    if (static_cast<int>(workers_.size()) != want_workers) resize(want_workers);
    {
      std::lock_guard<std::mutex> lock(mu_);
      body_ = &body;
      tasks_ = tasks;
      next_.store(0);
      active_ = static_cast<int>(workers_.size());
      error_ = nullptr;
      ++generation_;
    }
    work_cv_.notify_all();
    drain();
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return active_ == 0; });
    body_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

  static Pool& instance() {
    static Pool* pool = new Pool();  // leaked on purpose: no join during static destruction
    return *pool;
  }

 private:
  void drain() {
    for (int t = next_.fetch_add(1); t < tasks_; t = next_.fetch_add(1)) {
      try {
        (*body_)(t);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu_);
        if (!error_) error_ = std::current_exception();
      }
    }
  }

  // `seen` is the generation current when the worker was made: a call that
  // starts before the thread first runs must still be picked up.
  void worker_loop(std::uint64_t seen) {
    while (true) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
      }
      drain();
      std::lock_guard<std::mutex> lock(mu_);
      if (--active_ == 0) done_cv_.notify_one();
    }
  }

  void resize(int n) {
    stop_workers();
    stop_ = false;
    const std::uint64_t gen = generation_;
    for (int i = 0; i < n; ++i) workers_.emplace_back([this, gen] { worker_loop(gen); });
  }

  void stop_workers() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (auto& w : workers_) w.join();
    workers_.clear();
  }

  // A forked child has only the forking thread: forget the parent's workers
  // (they do not exist here) and start fresh ones on the next call.
  static void after_fork_in_child() {
    Pool& p = instance();
    // Leak the old vector: destroying joinable std::threads would terminate.
    new (&p.workers_) std::vector<std::thread>();
    new (&p.mu_) std::mutex();
    new (&p.call_mu_) std::mutex();
    new (&p.work_cv_) std::condition_variable();
    new (&p.done_cv_) std::condition_variable();
    p.stop_ = false;
  }

  std::mutex call_mu_;  // one parallel_for at a time
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::vector<std::thread> workers_;
  const std::function<void(int)>* body_ = nullptr;
  std::atomic<int> next_{0};
  std::atomic<int> wanted_{0};
  int tasks_ = 0;
  int active_ = 0;
  std::uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace

int num_threads() { return Pool::instance().threads(); }

void set_num_threads(int n) {
  MEGALITH_EXPECTS(n >= 1, invalid_argument, "set_num_threads(", n, "): need at least 1 thread");
  Pool::instance().set_threads(n);
}

void parallel_for(int tasks, const std::function<void(int)>& body) {
  Pool::instance().run(tasks, body);
}

}  // namespace megalith::cpu
