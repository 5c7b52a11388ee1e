#include "thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace jat {

int available_threads() {
  static const int count = [] {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
    return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  }();
  return count;
}

namespace {

class ThreadPool {
 public:
  explicit ThreadPool(int workers) {
    for (int i = 0; i < workers; ++i) threads_.emplace_back([this, i] { work(i); });
  }

  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
  }

  int workers() const { return static_cast<int>(threads_.size()); }

  std::mutex& busy() { return busy_; }

  // Caller holds busy(); helpers = workers that join the caller.
  void run(int64_t tasks, int helpers, const std::function<void(int64_t)>& fn) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      fn_ = &fn;
      tasks_ = tasks;
      helpers_ = helpers;
      next_.store(0);
      done_.store(0);
      ++generation_;
    }
    wake_.notify_all();
    drain();
    // the caller finished its share; wait for tasks still running on workers
    while (done_.load(std::memory_order_acquire) < tasks_) {
      std::this_thread::yield();
    }
    std::unique_lock<std::mutex> lock(mutex_);
    idle_.wait(lock, [this] { return running_ == 0; });
    fn_ = nullptr;
  }

 private:
  void drain() {
    for (int64_t t; (t = next_.fetch_add(1)) < tasks_;) {
      (*fn_)(t);
      done_.fetch_add(1, std::memory_order_release);
    }
  }

  void work(int index) {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      if (index >= helpers_) continue;
      ++running_;
      lock.unlock();
      drain();
      lock.lock();
      if (--running_ == 0) idle_.notify_all();
    }
  }

  std::vector<std::thread> threads_;
  std::mutex busy_;
  std::mutex mutex_;
  std::condition_variable wake_, idle_;
  bool stopping_ = false;
  uint64_t generation_ = 0;
  int helpers_ = 0;
  int running_ = 0;
  int64_t tasks_ = 0;
  const std::function<void(int64_t)>* fn_ = nullptr;
  std::atomic<int64_t> next_{0}, done_{0};
};

ThreadPool& pool() {
  // leaked on purpose: joining threads during static destruction at exit can deadlock
  static ThreadPool* instance = new ThreadPool(available_threads() - 1);
  return *instance;
}

}  // namespace

void parallel_for(int64_t tasks, int threads, const std::function<void(int64_t)>& fn) {
  threads = std::min<int64_t>({static_cast<int64_t>(threads), tasks,
                               static_cast<int64_t>(available_threads())});
  if (threads <= 1) {
    for (int64_t t = 0; t < tasks; ++t) fn(t);
    return;
  }
  ThreadPool& p = pool();
  std::unique_lock<std::mutex> busy(p.busy(), std::try_to_lock);
  if (!busy.owns_lock()) {
    for (int64_t t = 0; t < tasks; ++t) fn(t);
    return;
  }
  p.run(tasks, std::min(threads - 1, p.workers()), fn);
}

}  // namespace jat
