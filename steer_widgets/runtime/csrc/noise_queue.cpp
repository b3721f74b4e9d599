// The queue of noise_queue.h.
#include "noise_queue.h"

#include <algorithm>
#include <exception>
#include <utility>
#include <vector>

#include <pthread.h>

namespace sw {

struct NoiseQueue::Job {
  Job(int64_t size, Draw d, int64_t c) : n(size), chunk(c), draw(std::move(d)) {}

  // one more chunk (block: after the one another thread is drawing); false once none is left.
  // A chunk that throws ends the job and keeps the exception for finish: on a worker it would
  // otherwise leave the thread and end the process.
  bool step(bool block, std::atomic<int64_t>& open) {
    std::unique_lock<std::mutex> lock(m, std::defer_lock);
    if (block) {
      lock.lock();
    } else if (!lock.try_lock()) {
      return false;
    }
    if (next >= n) return false;
    const int64_t end = std::min(n, next + chunk);
    try {
      draw(next, end);
      next = end;
    } catch (...) {
      error = std::current_exception();
      next = n;
    }
    if (next == n) open.fetch_sub(1, std::memory_order_acq_rel);
    return true;
  }

  std::exception_ptr take_error() {
    std::lock_guard<std::mutex> lock(m);
    return std::exchange(error, nullptr);
  }

  void cancel(std::atomic<int64_t>& open) {
    std::lock_guard<std::mutex> lock(m);
    if (next < n) open.fetch_sub(1, std::memory_order_acq_rel);
    next = n;
  }

  // the draw, handed to the caller once the job is over: a worker may still hold the job
  // (step copies the list), and the draw may own what only the caller's thread may free (a
  // tensor whose last reference takes Python's lock, which a worker at interpreter exit
  // cannot take: the process aborted)
  Draw release() {
    std::lock_guard<std::mutex> lock(m);
    Draw out;
    out.swap(draw);
    return out;
  }

  const int64_t n;
  const int64_t chunk;  // draws a step takes
  Draw draw;  // under m; empty once released
  int64_t next = 0;  // draws made, under m
  std::exception_ptr error;  // a chunk's, under m; rethrown by finish
  std::mutex m;
};

namespace {
NoiseQueue*& instance() {
  static NoiseQueue* queue = new NoiseQueue();
  return queue;
}
}  // namespace

NoiseQueue& NoiseQueue::get() {
  static const bool once = [] {
    pthread_atfork(nullptr, nullptr, [] { instance() = new NoiseQueue(); });
    return true;
  }();
  (void)once;
  return *instance();
}

int64_t NoiseQueue::submit(int64_t n, Draw draw, int64_t chunk) {
  auto job = std::make_shared<Job>(n, std::move(draw), std::max<int64_t>(chunk, 1));
  std::lock_guard<std::mutex> lock(m_);
  const int64_t ticket = next_ticket_++;
  jobs_.emplace(ticket, job);
  if (n > 0) open_.fetch_add(1, std::memory_order_release);
  return ticket;
}

bool NoiseQueue::finish(int64_t ticket) {
  auto job = take(ticket);
  if (!job) return false;
  while (job->step(true, open_)) {
  }
  const std::exception_ptr error = job->take_error();
  job->release();  // freed here, on the caller's thread
  if (error) std::rethrow_exception(error);
  return true;
}

void NoiseQueue::cancel(int64_t ticket) {
  if (auto job = take(ticket)) {
    job->cancel(open_);
    job->release();
  }
}

bool NoiseQueue::step() {
  if (!pending()) return false;
  std::vector<std::shared_ptr<Job>> jobs;
  {
    std::lock_guard<std::mutex> lock(m_);
    for (auto& entry : jobs_) jobs.push_back(entry.second);
  }
  for (auto& job : jobs)
    if (job->step(false, open_)) return true;
  return false;
}

std::shared_ptr<NoiseQueue::Job> NoiseQueue::take(int64_t ticket) {
  std::lock_guard<std::mutex> lock(m_);
  auto it = jobs_.find(ticket);
  if (it == jobs_.end()) return nullptr;
  auto job = it->second;
  jobs_.erase(it);
  return job;
}

}  // namespace sw
