// The pool of pool.h: published jobs, chunks claimed through each job's own counter.
#include "pool.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <pthread.h>

#include "noise_queue.h"

namespace sw {
namespace {

inline void relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

// One call: immutable once published but for its two counters.
struct Job {
  Job(const RangeFn* f, int64_t size, int64_t c)
      : fn(f), n(size), chunk(c), tasks((size + c - 1) / c) {}

  // claims and runs chunks until none is left. A chunk that throws is caught here, on
  // whichever thread ran it (an exception leaving a worker's thread would end the process,
  // and one leaving the caller's would return while workers still run chunks that reference
  // its stack); once one has thrown, the chunks left are claimed and counted without running
  void work() noexcept {
    for (;;) {
      const int64_t t = claimed.fetch_add(1, std::memory_order_relaxed);
      if (t >= tasks) return;  // past the last chunk: fn is not touched (it may be gone)
      if (!failed.load(std::memory_order_relaxed)) run(t);
      completed.fetch_add(1, std::memory_order_release);  // publishes `error` too
    }
  }

  // the caller's, once wait() has returned: the first chunk's exception, rethrown on the
  // caller's thread (which then owns it; the job may outlive the call on a worker)
  void rethrow() {
    if (error) std::rethrow_exception(std::exchange(error, nullptr));
  }

  // until every chunk is completed (their writes visible here); yields now and then, so a
  // worker preempted mid-chunk on an oversubscribed machine gets the core back
  void wait() const {
    for (int spin = 1; completed.load(std::memory_order_acquire) < tasks; ++spin) {
      if (spin % 256 == 0) {
        std::this_thread::yield();
      } else {
        relax();
      }
    }
  }

  const RangeFn* const fn;
  const int64_t n, chunk, tasks;
  std::atomic<int64_t> claimed{0}, completed{0};

 private:
  void run(int64_t t) noexcept {
    const int64_t b0 = t * chunk;
    try {
      (*fn)(b0, std::min(n, b0 + chunk));
    } catch (...) {  // the first is kept; written before this chunk is counted completed
      if (!failed.exchange(true, std::memory_order_relaxed)) error = std::current_exception();
    }
  }

  std::atomic<bool> failed{false};
  std::exception_ptr error;  // the first chunk's exception; read after wait()
};

class Pool {
 public:
  // never destroyed (its threads live as long as the process); a forked child, which has
  // none of its parent's threads, starts a fresh one
  static Pool& get() {
    static const bool once = [] {
      pthread_atfork(nullptr, nullptr, [] { instance() = new Pool(); });
      return true;
    }();
    (void)once;
    return *instance();
  }

  void run(int64_t threads, int64_t n, int64_t grain, const RangeFn& fn) {
    const int64_t want = std::min<int64_t>(threads, (n + grain - 1) / grain);
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (want <= 1 || !busy.owns_lock()) {
      if (n > 0) fn(0, n);
      return;
    }
    grow(want - 1);
    auto job = std::make_shared<Job>(&fn, n, (n + want - 1) / want);
    {
      std::lock_guard<std::mutex> lock(wake_);
      job_ = job;
      generation_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
    job->work();
    job->wait();
    job->rethrow();
  }

  void nudge(int64_t threads) {
    {
      std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
      if (busy.owns_lock()) grow(threads - 1);
    }
    { std::lock_guard<std::mutex> lock(wake_); }
    cv_.notify_all();
  }

  int64_t workers() {
    std::lock_guard<std::mutex> lock(busy_);
    return workers_;
  }

 private:
  static Pool*& instance() {
    static Pool* pool = new Pool();
    return pool;
  }

  // under busy_
  void grow(int64_t workers) {
    for (; workers_ < workers; ++workers_) std::thread([this] { loop(); }).detach();
  }

  // the next published job (null until there is one), and its generation
  std::shared_ptr<Job> current(uint64_t& seen) {
    std::lock_guard<std::mutex> lock(wake_);
    seen = generation_.load(std::memory_order_relaxed);
    return job_;
  }

  void loop() {
    uint64_t seen = 0;
    current(seen);  // jobs published before this thread started are not its own
    for (;;) {
      wait_for_change(seen);
      if (auto job = current(seen)) job->work();
    }
  }

  // spins (drawing idle work between looks), then sleeps, until the generation changes
  void wait_for_change(uint64_t seen) {
    for (;;) {
      auto until = std::chrono::steady_clock::now() + kSpin;
      for (int spin = 1;; ++spin) {
        if (generation_.load(std::memory_order_acquire) != seen) return;
        if (NoiseQueue::get().step()) {
          until = std::chrono::steady_clock::now() + kSpin;
        } else {
          relax();
        }
        if (spin % 64 == 0 && std::chrono::steady_clock::now() > until) break;
      }
      std::unique_lock<std::mutex> lock(wake_);
      cv_.wait(lock, [&] {
        return generation_.load(std::memory_order_relaxed) != seen || NoiseQueue::get().pending();
      });
    }
  }

  static constexpr auto kSpin = std::chrono::microseconds(200);  // then sleep
  std::mutex busy_;  // held by the caller of run, and while workers are started
  std::mutex wake_;  // guards job_ and the generation's changes; the workers sleep on it
  std::condition_variable cv_;
  std::shared_ptr<Job> job_;
  std::atomic<uint64_t> generation_{0};
  int64_t workers_ = 0;  // under busy_
};

}  // namespace

void pool_run(int64_t threads, int64_t n, int64_t grain, const RangeFn& fn) {
  Pool::get().run(threads, n, grain, fn);
}

void pool_nudge(int64_t threads) { Pool::get().nudge(threads); }

int64_t pool_workers() { return Pool::get().workers(); }

}  // namespace sw
