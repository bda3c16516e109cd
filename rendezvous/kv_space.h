#pragma once
// The server's key-value state: c10d semantics plus parked waiters. A get or wait whose keys
// are missing registers a callback that fires (outside the lock, on the thread of the set
// that completed it) when the last key arrives; the caller pairs it with a deadline from
// TimerQueue. No gRPC here, so it is tested on its own.
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "rendezvous/store.h"

namespace ddpl::rdzv {

class KvSpace {
 public:
  using WaitId = uint64_t;
  using Ready = std::function<void(std::vector<Bytes> values)>;

  struct WaitStart {
    bool ready = false;         // every key existed: `values` holds them, nothing registered
    std::vector<Bytes> values;  // in key order, when ready and values were wanted
    WaitId id = 0;              // otherwise: the registration, for cancelWait
  };

  void set(const std::string& key, Bytes value);
  void multiSet(const std::vector<std::string>& keys, std::vector<Bytes> values);
  // Throws StoreError when the current value is not a decimal integer, or when the sum does
  // not fit int64 (the counter keeps its value: an overflow is an error, never a wrap).
  int64_t add(const std::string& key, int64_t delta);
  Bytes compareSet(const std::string& key, const Bytes& expected, Bytes desired);
  bool check(const std::vector<std::string>& keys) const;
  bool deleteKey(const std::string& key);
  int64_t numKeys(const std::string& prefix) const;
  // Removes every key starting with `prefix` (not empty); returns how many. Parked waiters
  // stay parked.
  int64_t deletePrefix(const std::string& prefix);

  // Either answers at once or parks `on_ready`, which then runs exactly once unless
  // cancelWait wins first.
  WaitStart waitFor(const std::vector<std::string>& keys, bool want_values, Ready on_ready);
  // True when the waiter was still parked: it is removed and its callback never runs.
  bool cancelWait(WaitId id);

  std::vector<std::string> missing(const std::vector<std::string>& keys) const;
  size_t parkedCount() const;

 private:
  struct Waiter {
    std::vector<std::string> keys;
    bool want_values = false;
    Ready on_ready;
  };
  using Fired = std::vector<std::pair<Ready, std::vector<Bytes>>>;

  // Caller holds mu_: wakes every waiter parked on `key` whose keys all exist now.
  void collectReadyLocked(const std::string& key, Fired& fired);
  void unparkLocked(WaitId id, const Waiter& w);
  static void run(Fired& fired);

  mutable std::mutex mu_;
  std::map<std::string, Bytes> data_;  // ordered, so numKeys(prefix) is a range scan
  WaitId next_id_ = 1;
  std::unordered_map<WaitId, Waiter> waiters_;
  std::unordered_map<std::string, std::vector<WaitId>> by_key_;
};

// Parses c10d's decimal counter encoding; throws StoreError naming the key otherwise.
int64_t parseCounter(const std::string& key, const Bytes& value);

// old + delta for add(); throws StoreError naming the key and the numbers when the sum does
// not fit int64 (every store: an overflow is an error, never a wrap).
int64_t addCounter(const std::string& key, int64_t old, int64_t delta);

}  // namespace ddpl::rdzv
