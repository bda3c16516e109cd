#pragma once
// The key-value store every part of ddplaunch bootstraps through, with c10d semantics.
// Values are opaque bytes: nothing read from a store is ever executed or deserialised into
// code. Implementations: gRPC client (rendezvous/client/grpc_store.h), in-memory, file, and a
// prefix decorator; one conformance suite (tests/unit/store_conformance_test.cc) runs against all.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/defaults.h"

namespace ddpl::rdzv {

using Bytes = std::vector<uint8_t>;
using Clock = std::chrono::steady_clock;
using Duration = std::chrono::milliseconds;

inline constexpr Duration kDefaultStoreTimeout{defaults::kStoreTimeout};

inline Bytes toBytes(const std::string& s) { return Bytes(s.begin(), s.end()); }
inline std::string toString(const Bytes& b) { return std::string(b.begin(), b.end()); }

// "'a', 'b' and 3 more": the keys an error message names (at most 8, then a count).
std::string quoteKeys(const std::vector<std::string>& keys);

class Store {
 public:
  virtual ~Store() = default;

  virtual void set(const std::string& key, const Bytes& value) = 0;

  // Blocks until the key exists or `timeout` passes (ddpl::TimeoutError naming the key and
  // how long was waited).
  virtual Bytes get(const std::string& key, Duration timeout) = 0;

  // Atomically adds `delta` to the integer stored at key (decimal ASCII, as c10d does; a
  // missing key counts as 0) and returns the new value. A non-integer value is a StoreError.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;

  // Sets key to `desired` if its current value equals `expected` (an empty `expected` means
  // "key absent"). Returns the value the key holds afterwards, as c10d's compareSet does.
  virtual Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) = 0;

  // True when every key exists, without blocking.
  virtual bool check(const std::vector<std::string>& keys) = 0;

  // Blocks until every key exists or `timeout` passes (TimeoutError naming the missing keys).
  virtual void wait(const std::vector<std::string>& keys, Duration timeout) = 0;

  // Returns whether the key existed.
  virtual bool deleteKey(const std::string& key) = 0;

  virtual int64_t numKeys() = 0;

  virtual std::vector<Bytes> multiGet(const std::vector<std::string>& keys, Duration timeout) = 0;
  virtual void multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) = 0;
};

}  // namespace ddpl::rdzv
