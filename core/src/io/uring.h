#pragma once
// The io_uring backend of AsyncIO: one ring, and one thread that owns it.
// [Note: one thread submits and reaps]
// Callers only queue blocks and poke an eventfd; the ring thread moves them
// into the ring, waits in io_uring_enter and finishes blocks as their
// completions arrive. Keeping every submission on that one thread means no
// lock around the rings, and no request depends on a caller thread (the
// kernel runs a request's deferred completion work on the task that submitted
// it, and its async workers belong to that task).
// The ring reads or writes a block in one piece (resubmitting the rest after a
// short transfer) through the buffered descriptor, or through the O_DIRECT one
// when the block's offset, length and memory are all aligned. Other blocks of
// a direct file (misaligned memory, an unaligned head or tail) need
// transfer()'s bounce buffer and buffered head and tail: they go to a thread
// pool, made at first need.

#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "engine_detail.h"
#include "uring_ring.h"

namespace megalith::io::detail {

class UringPool final : public Executor {
 public:
  /// Throws io_error naming the reason and the fix when no ring can be set up.
  UringPool(int queue_depth, int fallback_threads, std::size_t block_bytes);
  ~UringPool() override;  // finishes what was pushed, then joins
  void push(std::vector<Block>&& blocks) override;

 private:
  /// A block in the ring: the descriptor it runs on now, and how far it got.
  struct Op {
    Block block;
    int fd = -1;
    bool on_direct = false;
    std::size_t done = 0;
  };

  void run();
  void arm_wake();
  void start(unsigned slot, Block&& b);
  void prepare(unsigned slot);
  void complete(unsigned slot, int res);
  void end(unsigned slot, std::exception_ptr error);
  WorkerPool& fallback();

  Ring ring_;
  int wake_fd_ = -1;  // eventfd: written by push() and the destructor
  int fallback_threads_;
  std::size_t block_bytes_;
  std::once_flag fallback_once_;
  std::unique_ptr<WorkerPool> fallback_;

  std::mutex mu_;  // guards incoming_ and stopping_
  std::vector<Block> incoming_;
  bool stopping_ = false;

  // The ring thread's own.
  std::vector<Op> ops_;         // one per slot of the queue depth
  std::vector<unsigned> free_;  // slots not in the ring
  std::deque<Block> waiting_;   // taken from incoming_, no slot yet
  std::thread thread_;
};

}  // namespace megalith::io::detail
