// A bounded pool of std::threads (at most the CPUs this process may run on).
#pragma once

#include <cstdint>
#include <functional>

namespace jat {

// Threads this process may run on (sched_getaffinity), at least 1.
int available_threads();

// Runs fn(task) for every task in [0, tasks) on up to `threads` threads, the caller
// included, and returns when all are done. Tasks are handed out dynamically. When another
// caller is using the pool (XLA may run two custom calls at once) it runs inline instead.
//
//   parallel_for(blocks, 2, [&](int64_t b) { compute_block(b); });
void parallel_for(int64_t tasks, int threads, const std::function<void(int64_t)>& fn);

}  // namespace jat
