#pragma once
// Decorator that puts every key of one user (a run, an attempt) under a prefix, as c10d's
// PrefixStore does. numKeys() is the wrapped store's count, as in c10d: the Store interface
// has no way to list keys, so a prefix-only count would have to be guessed. The gRPC store
// applies its own prefix on the server and counts only its namespace.
#include <memory>

#include "rendezvous/store/store.h"

namespace ddpl::rdzv {

class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> inner);

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

  const std::string& prefix() const { return prefix_; }

 private:
  std::string k(const std::string& key) const { return prefix_ + key; }
  std::vector<std::string> k(const std::vector<std::string>& keys) const;

  std::string prefix_;
  std::shared_ptr<Store> inner_;
};

}  // namespace ddpl::rdzv
