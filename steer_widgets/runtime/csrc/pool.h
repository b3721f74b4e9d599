// One thread pool for every kernel call, whoever calls (no torch, no OpenMP).
//
// The kernels split their work over this pool rather than at::parallel_for: OpenMP gives
// each calling thread its own team, and once a process holds more OpenMP threads than cores
// libgomp stops spinning and every parallel region pays a futex wake-up (decoding on the
// explorer's worker thread ran at 47 tokens/s against 111 on the main thread, 2026-12-01).
//
// Each call is published as one job that nothing changes after it is published: its range,
// its chunk size, and two counters of its own, the chunks claimed and the chunks completed.
// Any thread (the caller, a worker that saw this job, a worker that arrives late) claims a
// chunk by incrementing the claim counter; a claim past the last chunk does nothing, so a
// late worker never touches the range function. The caller runs chunks too, then waits
// until every chunk is completed, and only then returns. Workers hold the job by a shared
// pointer, so a worker still looking at a finished job reads memory that is still its.
// A chunk that throws, on any thread, is caught where it ran: the chunks not yet begun are
// skipped, the caller still waits for those under way (they may reference its stack), then
// rethrows the first exception (a per-chunk buffer's std::bad_alloc, say) on its own thread.
// Results never depend on which thread ran which chunk: each output is computed whole by one
// thread in a fixed order.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>

namespace sw {

using RangeFn = std::function<void(int64_t, int64_t)>;

// fn over [0, n) on t = min(threads, ceil(n / grain)) threads (the caller included), in
// chunks of ceil(n / t), the last one shorter: `grain` is the least work worth a thread of
// its own, not a chunk's least size (n = 5, grain = 4: chunks of 3 and 2), as
// at::parallel_for splits. One caller uses the workers at a time; a second caller
// meanwhile runs its call alone on its own thread. An exception from fn reaches the caller
// once no chunk is running (above).
void pool_run(int64_t threads, int64_t n, int64_t grain, const RangeFn& fn);

// Idle work was queued (noise_queue.h): the workers wake, up to threads - 1 of them started
// first where there are fewer.
void pool_nudge(int64_t threads);

// The workers the pool has started so far (they live as long as the process).
int64_t pool_workers();

// at::parallel_for's contract, on the pool
template <typename F>
void parallel_for(int64_t threads, int64_t begin, int64_t end, int64_t grain, const F& f) {
  if (end <= begin) return;
  pool_run(threads, end - begin, std::max<int64_t>(grain, 1),
           [&](int64_t b0, int64_t b1) { f(begin + b0, begin + b1); });
}

}  // namespace sw
