#pragma once
// c10d::Store over ddpl::rdzv::Store, so that LibTorch's process groups bootstrap from our
// rendezvous store (gRPC client, or MemoryStore in tests).
#include <memory>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "rendezvous/store/store.h"

namespace ddpl::worker {

class RdzvC10dStore : public c10d::Store {
 public:
  explicit RdzvC10dStore(std::shared_ptr<rdzv::Store> store,
                         std::chrono::milliseconds timeout = c10d::Store::kDefaultTimeout);

  c10::intrusive_ptr<c10d::Store> clone() override;
  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;
  void append(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<std::vector<uint8_t>> multiGet(const std::vector<std::string>& keys) override;
  void multiSet(const std::vector<std::string>& keys,
                const std::vector<std::vector<uint8_t>>& values) override;
  bool hasExtendedApi() const override { return true; }

  const std::shared_ptr<rdzv::Store>& underlying() const { return store_; }

 private:
  std::shared_ptr<rdzv::Store> store_;
};

}  // namespace ddpl::worker
