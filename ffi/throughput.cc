#include "throughput.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "isa.h"
#include "kernel_table.h"
#include "thread_pool.h"

namespace jat {
namespace {

double elapsed_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

FmaLoopFn fma_loop_for(const std::string& dtype) {
  const KernelTable& table = kernels_for(isa_choice().effective);
  if (dtype == "float32") return table.fma_loop_f32;
  if (dtype == "float64") return table.fma_loop_f64;
  throw std::invalid_argument("dtype: expected 'float32' or 'float64', got '" + dtype + "'");
}

}  // namespace

int64_t fma_flops_per_iteration(const std::string& dtype) {
  fma_loop_for(dtype);  // validates dtype
  const int64_t lanes = kernels_for(isa_choice().effective).vector_bytes /
                        (dtype == "float32" ? 4 : 8);
  return int64_t{kFmaChains} * 2 * lanes;
}

double fma_seconds(const std::string& dtype, int64_t iterations, int threads) {
  const FmaLoopFn loop = fma_loop_for(dtype);
  std::vector<double> sink(threads > 0 ? threads : 1);
  const auto start = std::chrono::steady_clock::now();
  parallel_for(static_cast<int64_t>(sink.size()), static_cast<int>(sink.size()),
               [&](int64_t t) { sink[t] = loop(iterations); });
  const double seconds = elapsed_since(start);
  volatile double keep = sink[0];  // the results must look used
  (void)keep;
  return seconds;
}

double copy_seconds(int64_t bytes, int threads) {
  static std::mutex mutex;
  static std::map<int64_t, std::pair<std::vector<char>, std::vector<char>>> buffers;
  std::lock_guard<std::mutex> lock(mutex);
  auto& [from, to] = buffers[bytes];
  if (from.empty()) {
    from.assign(bytes, 1);  // touched, so page faults stay out of the timing
    to.assign(bytes, 0);
  }
  const int64_t chunks = threads > 0 ? threads : 1;
  const int64_t chunk = (bytes + chunks - 1) / chunks;
  const auto start = std::chrono::steady_clock::now();
  parallel_for(chunks, static_cast<int>(chunks), [&](int64_t c) {
    const int64_t begin = c * chunk;
    const int64_t size = std::min(chunk, bytes - begin);
    if (size > 0) std::memcpy(to.data() + begin, from.data() + begin, size);
  });
  return elapsed_since(start);
}

}  // namespace jat
