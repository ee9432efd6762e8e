#pragma once
// How an elementwise host step splits its elements over the engine's threads.

#include <cstdint>
#include <string>

namespace megalith::optim::cpu::detail {

enum class Schedule {
  blocked,      // task t takes the t-th contiguous 1/T of the range
  interleaved,  // task t takes chunks t, t + T, t + 2T, ... (see cpu_schedule.cpp)
};

// The schedule for one elementwise pass (a step kernel: each element's result is the
// same under either split) over `total` elements with `tasks` threads. `timed` is set
// when the pass is one of the first-use measurements: time it and report().
Schedule step_schedule(std::int64_t total, int tasks, bool* timed);
void report_step_time(Schedule s, std::int64_t total, double seconds);

// "blocked" / "interleaved" (chosen, or forced by MEGALITH_CPU_SCHEDULE), or
// "measuring" before the first-use measurements are done.
std::string step_schedule_name();

}  // namespace megalith::optim::cpu::detail
