#pragma once
// Internal to the gRPC layer: the "one write in flight plus a queue" bookkeeping that every
// streaming reactor needs (gRPC's callback API allows one outstanding write per stream). Not
// thread-safe on its own: the reactor calls it under its own mutex and makes the StartWrite
// call that push()/next() ask for after releasing that mutex (gRPC may run OnWriteDone on the
// calling thread before StartWrite returns).
//
// It also counts what is queued, in messages and bytes, so that a reactor can apply
// back-pressure (stop reading) and a server can bound the memory its streams hold.
//
// What waits may be lighter than what is written (`Item`, e.g. an answer that references the
// store's values instead of holding copies): it becomes the message, through
// intoMessage(Item&&, Msg*) (found by argument-dependent lookup), only when its turn to be
// written comes, so a stream that does not read holds one full message, not one per answer.
#include <cstddef>
#include <deque>
#include <utility>

namespace ddpl::rdzv::grpc_detail {

template <typename Msg>
void intoMessage(Msg&& m, Msg* out) {
  *out = std::move(m);
}

template <typename Msg, typename Item = Msg>
class WriteQueue {
 public:
  // What the caller must write now, outside its lock: `msg` is null when nothing is to be
  // written (the message was queued behind the write in flight, or the queue is empty).
  // `last`: write it with StartWriteAndFinish.
  struct Start {
    Msg* msg = nullptr;
    bool last = false;
  };

  // Queues `m` (of `bytes` bytes, as counted against the caller's limits), or hands it back
  // to be written at once when no write is in flight.
  Start push(Item m, size_t bytes, bool last = false) {
    if (writing_) {
      queue_.push_back({std::move(m), bytes, last});
      queued_bytes_ += bytes;
      return {};
    }
    writing_ = true;
    intoMessage(std::move(m), &current_);
    current_bytes_ = bytes;
    return {&current_, last};
  }

  // The write in flight completed: returns the next message to write, or nothing (then no
  // write is in flight any more).
  Start next() {
    current_bytes_ = 0;
    if (queue_.empty()) {
      writing_ = false;
      return {};
    }
    Entry e = std::move(queue_.front());
    queue_.pop_front();
    queued_bytes_ -= e.bytes;
    intoMessage(std::move(e.msg), &current_);
    current_bytes_ = e.bytes;
    return {&current_, e.last};
  }

  // The stream broke: drop what waits (the write in flight, if any, stays until it completes).
  void clear() {
    queue_.clear();
    queued_bytes_ = 0;
  }
  // No completion will come for the write in flight (the stream is done).
  void abandon() {
    clear();
    writing_ = false;
    current_bytes_ = 0;
  }

  bool writing() const { return writing_; }
  size_t queued() const { return queue_.size(); }
  // Bytes waiting, including the write in flight.
  size_t bytes() const { return queued_bytes_ + current_bytes_; }

 private:
  struct Entry {
    Item msg;
    size_t bytes;
    bool last;
  };
  bool writing_ = false;
  Msg current_;  // the write in flight; gRPC reads it until OnWriteDone
  size_t current_bytes_ = 0;
  std::deque<Entry> queue_;
  size_t queued_bytes_ = 0;
};

}  // namespace ddpl::rdzv::grpc_detail
