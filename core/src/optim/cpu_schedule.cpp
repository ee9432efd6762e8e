// [Note: schedule by measurement] Which split of an elementwise step is faster
// depends on the machine: on the 16-core H200 host the contiguous split ran fp32
// AdamW over 1e9 parameters at 4.79 Gparam/s and the interleaved one (all threads
// streaming through the same neighbourhood of each buffer, as DeepSpeed's tiles do)
// at 4.23, and on the 2-core CI box it was the faster too by a few percent (noisy);
// other memory systems may keep fewer DRAM pages open when interleaving. So the first
// large steps of a process measure both: kTrials passes each, alternating, of at least
// kTimedMin elements; each split's best per-element time (which load spikes do not
// lower) decides, interleaved only if clearly faster, for the rest of the process. Results do not
// depend on it: the step kernels compute each element alone, and the reductions
// (grad_stats) keep the contiguous split. MEGALITH_CPU_SCHEDULE=blocked|interleaved
// forces one (benchmarks); "auto" or unset measures.

#include "cpu_schedule.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>

#include "megalith/optim/cpu.h"

namespace megalith::optim::cpu::detail {
namespace {

constexpr std::int64_t kTimedMin = std::int64_t{1} << 22;  // 16 MiB of fp32 a buffer
constexpr int kTrials = 4;
// The contiguous split stays unless the interleaved one is 7% faster: it won on
// both machines measured, and a shared box's noise should not flip the choice.
constexpr double kInterleavedMargin = 0.93;

struct Measured {
  std::mutex mu;
  int trials[2] = {0, 0};
  double best[2] = {std::numeric_limits<double>::infinity(),
                    std::numeric_limits<double>::infinity()};
  int chosen = -1;  // index into Schedule once measured
};

Measured& measured() {
  static Measured m;
  return m;
}

int forced() {
  const char* v = std::getenv("MEGALITH_CPU_SCHEDULE");
  if (v == nullptr || std::strcmp(v, "auto") == 0) return -1;
  if (std::strcmp(v, "blocked") == 0) return static_cast<int>(Schedule::blocked);
  if (std::strcmp(v, "interleaved") == 0) return static_cast<int>(Schedule::interleaved);
  return -1;  // an unknown value measures, as unset does
}

}  // namespace

Schedule step_schedule(std::int64_t total, int tasks, bool* timed) {
  *timed = false;
  if (int f = forced(); f >= 0) return static_cast<Schedule>(f);
  Measured& m = measured();
  std::lock_guard<std::mutex> lock(m.mu);
  if (m.chosen >= 0) return static_cast<Schedule>(m.chosen);
  if (tasks < 2 || total < kTimedMin) return Schedule::blocked;
  *timed = true;  // alternate, the one with fewer trials first
  return m.trials[1] < m.trials[0] ? Schedule::interleaved : Schedule::blocked;
}

void report_step_time(Schedule s, std::int64_t total, double seconds) {
  Measured& m = measured();
  std::lock_guard<std::mutex> lock(m.mu);
  if (m.chosen >= 0) return;
  const int i = static_cast<int>(s);
  m.best[i] = std::min(m.best[i], seconds / static_cast<double>(total));
  if (++m.trials[i] >= kTrials && m.trials[1 - i] >= kTrials) {
    const int inter = static_cast<int>(Schedule::interleaved);
    const int blocked = static_cast<int>(Schedule::blocked);
    m.chosen = m.best[inter] < kInterleavedMargin * m.best[blocked] ? inter : blocked;
  }
}

std::string step_schedule_name() {
  int f = forced();
  int chosen = f;
  if (chosen < 0) {
    Measured& m = measured();
    std::lock_guard<std::mutex> lock(m.mu);
    chosen = m.chosen;
  }
  if (chosen < 0) return "measuring";
  return chosen == static_cast<int>(Schedule::interleaved) ? "interleaved" : "blocked";
}

}  // namespace megalith::optim::cpu::detail

namespace megalith::optim::cpu {

std::string step_schedule() { return detail::step_schedule_name(); }

}  // namespace megalith::optim::cpu
