#pragma once
// A connection of the store's socket transport (wire_server.cc) or of torch's TCPStore
// protocol (wire_server_tcpstore.cc): what both halves of WireServer share. Internal.
#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "rendezvous/server/service_core.h"
#include "rendezvous/server/wire_server.h"

namespace ddpl::rdzv::grpc_detail {

// What a buffer of output costs besides its bytes (the chunk, the string's allocation).
inline constexpr int64_t kChunkOverheadBytes = 96;
// Requests of one connection handled per turn of the loop: the rest wait for the next turn,
// after every other connection that is ready has had its turn (a client that pipelines
// thousands of requests must not hold the one thread that serves everyone).
inline constexpr int kRequestsPerTurn = 512;

// One piece of a connection's output: bytes of its own, then (if set) a value of the store,
// written from where it lies.
struct WireServer::OutChunk {
  std::string bytes;
  KvSpace::Value value;
  size_t size() const { return bytes.size() + (value ? value->size() : 0); }
};

struct WireServer::Conn {
  uint64_t id = 0;
  int fd = -1;
  std::string peer;
  // The loop thread's alone.
  std::string in;
  size_t magic_seen = 0;
  std::atomic<bool> authed{false};  // it has shown its token
  bool lingering = false;

  std::mutex mu;  // guards everything below
  bool closed = false;
  bool reading = true;      // EPOLLIN armed: false while back-pressure holds it
  bool want_write = false;  // EPOLLOUT armed: the socket took less than the output
  bool batching = false;    // the loop is handling a read and flushes at its end
  // fail() ran: its error is the last frame; the write side is shut once the output before
  // it is written, so that answers owed before the error arrive whole.
  bool ending = false;
  bool shut_wr = false;
  // More requests have been read than one turn of the loop handles: EPOLLIN stays off until
  // they are (the loop comes back to it on its next turn).
  bool backlog = false;
  std::deque<OutChunk> out;  // answers not yet written, in order
  size_t out_off = 0;        // bytes of out.front() already written
  int64_t out_bytes = 0;     // bytes of `out` not yet written
  int64_t peak_out = 0;      // the most outBytes() has been, for Core::released
  uint64_t next_slot = 1;
  std::unordered_map<uint64_t, std::shared_ptr<ParkedOp>> parked;

  // torch's TCPStore protocol (wire_server_tcpstore.cc) instead of the store socket's.
  bool torch = false;
  std::string ns;              // its keys' namespace: the attempt it connected in
  uint64_t scope = 0;          // that attempt's number in this server (TorchScope::serial)
  bool cancel_pending = false;  // a CANCEL_WAIT waits for a wait's answer being written

  // What the output counts against the bounds on queued answers: its bytes (each value in
  // full, though shared with the store) and its chunks.
  int64_t outBytes() const {
    return out_bytes + kChunkOverheadBytes * static_cast<int64_t>(out.size());
  }
};

}  // namespace ddpl::rdzv::grpc_detail
