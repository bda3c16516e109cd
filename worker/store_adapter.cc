#include "worker/store_adapter.h"

#include "common/errors.h"

namespace ddpl::worker {

RdzvC10dStore::RdzvC10dStore(std::shared_ptr<rdzv::Store> store, std::chrono::milliseconds timeout)
    : c10d::Store(timeout), store_(std::move(store)) {
  if (!store_) throw InvalidArgument("RdzvC10dStore: null store");
}

c10::intrusive_ptr<c10d::Store> RdzvC10dStore::clone() {
  // Our stores are thread-safe and share one connection; a clone is another view of it.
  return c10::make_intrusive<RdzvC10dStore>(store_, timeout_);
}

void RdzvC10dStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  store_->set(key, value);
}

std::vector<uint8_t> RdzvC10dStore::compareSet(const std::string& key,
                                               const std::vector<uint8_t>& expected,
                                               const std::vector<uint8_t>& desired) {
  return store_->compareSet(key, expected, desired);
}

std::vector<uint8_t> RdzvC10dStore::get(const std::string& key) {
  return store_->get(key, timeout_);
}

int64_t RdzvC10dStore::add(const std::string& key, int64_t value) { return store_->add(key, value); }

bool RdzvC10dStore::deleteKey(const std::string& key) { return store_->deleteKey(key); }

bool RdzvC10dStore::check(const std::vector<std::string>& keys) { return store_->check(keys); }

int64_t RdzvC10dStore::getNumKeys() { return store_->numKeys(); }

void RdzvC10dStore::wait(const std::vector<std::string>& keys) { store_->wait(keys, timeout_); }

void RdzvC10dStore::wait(const std::vector<std::string>& keys,
                         const std::chrono::milliseconds& timeout) {
  // c10d's kNoTimeout (0) means "wait forever"; our stores always take a deadline, so use the
  // store's own timeout rather than turning 0 into an immediate failure.
  store_->wait(keys, timeout == c10d::Store::kNoTimeout ? timeout_ : timeout);
}

void RdzvC10dStore::append(const std::string& key, const std::vector<uint8_t>& value) {
  // c10d's append is atomic; compareSet in a loop gives the same guarantee over our interface.
  std::vector<uint8_t> current;
  for (;;) {
    const bool exists = store_->check({key});
    current = exists ? store_->get(key, timeout_) : std::vector<uint8_t>{};
    std::vector<uint8_t> desired = current;
    desired.insert(desired.end(), value.begin(), value.end());
    if (!exists && current.empty() && desired.empty()) {
      store_->set(key, desired);
      return;
    }
    if (store_->compareSet(key, current, desired) == desired) return;
  }
}

std::vector<std::vector<uint8_t>> RdzvC10dStore::multiGet(const std::vector<std::string>& keys) {
  return store_->multiGet(keys, timeout_);
}

void RdzvC10dStore::multiSet(const std::vector<std::string>& keys,
                             const std::vector<std::vector<uint8_t>>& values) {
  store_->multiSet(keys, values);
}

}  // namespace ddpl::worker
