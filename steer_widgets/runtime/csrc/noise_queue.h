// Idle work for the pool's workers: ordered draws, chunk by chunk (no torch).
//
// A sampled decode step draws Exp(1) noise over the vocabulary for every sampling row (the
// draw torch.multinomial makes), serially from that row's generator: its uniform draws, at
// least, whose logarithms vocab_pass takes only where a token can win. The draw depends
// on nothing the step computes, so the next step's draws are queued before the model runs,
// and the pool's workers draw them in chunks between the kernel calls they would otherwise
// spin through; whoever needs a draw finishes it. A job's chunks are drawn in order, one
// thread at a time (the job's own lock), so a draw that consumes a generator element by
// element gives the bits of one draw over the whole range, whoever drew which chunk.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>

namespace sw {

class NoiseQueue {
 public:
  // draw(begin, end) draws elements [begin, end), called with begin ascending from 0
  using Draw = std::function<void(int64_t, int64_t)>;

  static NoiseQueue& get();  // never destroyed; a forked child starts with no jobs

  // a job of n draws, drawn chunk draws at a time; its ticket for finish or cancel
  int64_t submit(int64_t n, Draw draw, int64_t chunk = kChunk);

  // the job's remaining chunks drawn on the calling thread (after a chunk another thread is
  // drawing), then forgotten; false for an unknown ticket (finished, cancelled, or begun in
  // a parent process). A chunk that threw, on whichever thread, ended the job: its exception
  // is rethrown here.
  bool finish(int64_t ticket);

  // the job dropped where it stands; a chunk being drawn elsewhere ends first
  void cancel(int64_t ticket);

  // a worker's turn: one chunk of the oldest job nobody is drawing; false if there was none
  bool step();

  // whether any job has draws left
  bool pending() const { return open_.load(std::memory_order_acquire) > 0; }

  // draws per chunk of torch's exponential_: ~20 us, the most a kernel call waits; a job of
  // cheaper draws takes more at a time, each chunk paying the call and the generator's state
  static constexpr int64_t kChunk = 512;

 private:
  struct Job;
  std::shared_ptr<Job> take(int64_t ticket);

  std::mutex m_;
  std::map<int64_t, std::shared_ptr<Job>> jobs_;  // by ticket: the oldest first
  int64_t next_ticket_ = 1;
  std::atomic<int64_t> open_{0};  // jobs with draws left
};

}  // namespace sw
