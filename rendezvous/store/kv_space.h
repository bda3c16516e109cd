#pragma once
// The server's key-value state: c10d semantics plus parked waiters. A get or wait whose keys
// are missing registers a callback that fires (outside the lock, on the thread of the set
// that completed it) when the last key arrives; the caller pairs it with a deadline from
// TimerQueue. No gRPC here, so it is tested on its own.
//
// Values are immutable once stored and shared, not copied, with whoever reads them
// (waitForShared): a get's answer holds a reference to the value, so a thousand gets of a
// 16 MiB value cost a thousand references, not 16 GB of copies made under this class's lock.
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "rendezvous/store/store.h"

namespace ddpl::rdzv {

class KvSpace {
 public:
  using WaitId = uint64_t;
  // A stored value: never changed once stored (a set stores a new one), so readers may keep
  // it after the key moves on.
  using Value = std::shared_ptr<const Bytes>;
  using Values = std::vector<Value>;
  using Ready = std::function<void(std::vector<Bytes> values)>;
  using ReadyShared = std::function<void(Values values)>;

  template <typename V>
  struct Start {
    bool ready = false;  // every key existed: `values` holds them, nothing registered
    V values;            // in key order, when ready and values were wanted
    WaitId id = 0;       // otherwise: the registration, for cancelWait
  };
  using WaitStart = Start<std::vector<Bytes>>;
  using SharedStart = Start<Values>;

  static Value share(Bytes value) { return std::make_shared<const Bytes>(std::move(value)); }

  void set(const std::string& key, Bytes value) { setShared(key, share(std::move(value))); }
  void setShared(const std::string& key, Value value);
  void multiSet(const std::vector<std::string>& keys, std::vector<Bytes> values);
  void multiSetShared(const std::vector<std::string>& keys, Values values);
  // Throws StoreError when the current value is not a decimal integer, or when the sum does
  // not fit int64 (the counter keeps its value: an overflow is an error, never a wrap).
  int64_t add(const std::string& key, int64_t delta);
  Bytes compareSet(const std::string& key, const Bytes& expected, Bytes desired);
  bool check(const std::vector<std::string>& keys) const;
  bool deleteKey(const std::string& key);
  int64_t numKeys(const std::string& prefix) const;
  // The keys starting with `prefix` (queues are not keys), without it, in order; each costs
  // `per_key_bytes` besides its own. Past `max_bytes` in all: no keys (complete=false), while
  // `count` and `bytes` still say the whole, so that a refusal names it.
  struct KeyList {
    std::vector<std::string> keys;
    int64_t count = 0;
    uint64_t bytes = 0;
    bool complete = true;
  };
  KeyList listKeys(const std::string& prefix, uint64_t max_bytes, uint64_t per_key_bytes) const;
  // Removes every key (and queue) starting with `prefix` (not empty); returns how many keys.
  // Parked waiters stay parked.
  int64_t deletePrefix(const std::string& prefix);

  // torch's TCPStore operations beyond c10d's Store (its append and queues, as its libuv
  // server has them). append adds `value` to the end of the key's value (a missing key is
  // created) and wakes its waiters.
  // Throws StoreError naming the sizes when the joined value would pass `max_bytes`.
  void append(const std::string& key, const Bytes& value, size_t max_bytes);
  // The key's value; null when it is missing (a queue of that name is not a value).
  Value getShared(const std::string& key) const;
  // Queues live beside the keys, by name: a non-empty queue counts as a present key for
  // check and wait, and a push wakes exactly one waiter parked on it (the one that will pop).
  void queuePush(const std::string& key, Bytes value);
  struct Popped {
    int64_t length_before = 0;  // 0: the queue was empty, nothing was popped
    Value value;
  };
  Popped queuePop(const std::string& key);
  int64_t queueLen(const std::string& key) const;

  // Either answers at once or parks `on_ready`, which then runs exactly once unless
  // cancelWait wins first.
  SharedStart waitForShared(const std::vector<std::string>& keys, bool want_values,
                            ReadyShared on_ready);
  // The same, with the values copied out (tests and tools; the server shares them).
  WaitStart waitFor(const std::vector<std::string>& keys, bool want_values, Ready on_ready);
  // True when the waiter was still parked: it is removed and its callback never runs.
  bool cancelWait(WaitId id);

  std::vector<std::string> missing(const std::vector<std::string>& keys) const;
  size_t parkedCount() const;

 private:
  struct Waiter {
    std::vector<std::string> keys;
    bool want_values = false;
    ReadyShared on_ready;
  };
  using Fired = std::vector<std::pair<ReadyShared, Values>>;

  // Caller holds mu_: wakes every waiter parked on `key` whose keys all exist now (at most
  // `limit` of them).
  void collectReadyLocked(const std::string& key, Fired& fired, size_t limit = SIZE_MAX);
  bool presentLocked(const std::string& key) const;  // a value, or a queue with an item
  Value valueLocked(const std::string& key) const;   // the value, or an empty one for a queue
  void unparkLocked(WaitId id, const Waiter& w);
  static void run(Fired& fired);

  mutable std::mutex mu_;
  std::map<std::string, Value> data_;  // ordered, so numKeys(prefix) is a range scan; never null
  std::map<std::string, std::deque<Value>> queues_;  // never empty: an emptied queue is erased
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
