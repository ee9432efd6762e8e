#pragma once
// The engine's host worker threads. One process-wide pool: the optimizer step
// and other bandwidth-bound host work split a range over it. The calling thread
// works too, so num_threads() == 1 means no worker threads at all.

#include <cstdint>
#include <functional>

#include "megalith/export.h"

namespace megalith::cpu {

/// Threads used by parallel_for. Default: MEGALITH_NUM_THREADS, else
/// OMP_NUM_THREADS, else the CPUs this process may run on.
MEGALITH_API int num_threads();

/// Sets the thread count (>= 1); takes effect at the next parallel_for.
MEGALITH_API void set_num_threads(int n);

/// Calls body(task) for task in [0, tasks) spread over the pool, and returns
/// when all are done. An exception from any task is rethrown here (the first).
/// Not reentrant: body must not call parallel_for.
MEGALITH_API void parallel_for(int tasks, const std::function<void(int)>& body);

}  // namespace megalith::cpu
