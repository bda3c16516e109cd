#pragma once
// In-process Store: used by tests, by ranks run as threads, and as the state behind the gRPC
// store service. Waiters block on a condition variable, never by polling.
#include <condition_variable>
#include <map>
#include <mutex>

#include "rendezvous/store/store.h"

namespace ddpl::rdzv {

class MemoryStore : public Store {
 public:
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, Duration timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, Duration timeout) override;
  bool deleteKey(const std::string& key) override;
  int64_t numKeys() override;
  std::vector<Bytes> multiGet(const std::vector<std::string>& keys, Duration timeout) override;
  void multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) override;

 private:
  // Caller holds mu_. Returns the keys still missing after waiting up to `timeout`.
  std::vector<std::string> waitLocked(std::unique_lock<std::mutex>& lock,
                                      const std::vector<std::string>& keys, Duration timeout);

  std::mutex mu_;
  std::condition_variable changed_;
  std::map<std::string, Bytes> data_;
};

}  // namespace ddpl::rdzv
