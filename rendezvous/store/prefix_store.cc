#include "rendezvous/store/prefix_store.h"

#include "common/errors.h"

namespace ddpl::rdzv {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> inner)
    : prefix_(std::move(prefix)), inner_(std::move(inner)) {
  if (!inner_) throw InvalidArgument("PrefixStore '" + prefix_ + "': no store to wrap");
}

std::vector<std::string> PrefixStore::k(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& key : keys) out.push_back(prefix_ + key);
  return out;
}

void PrefixStore::set(const std::string& key, const Bytes& value) { inner_->set(k(key), value); }
Bytes PrefixStore::get(const std::string& key, Duration timeout) {
  return inner_->get(k(key), timeout);
}
int64_t PrefixStore::add(const std::string& key, int64_t delta) {
  return inner_->add(k(key), delta);
}
Bytes PrefixStore::compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) {
  return inner_->compareSet(k(key), expected, desired);
}
bool PrefixStore::check(const std::vector<std::string>& keys) { return inner_->check(k(keys)); }
void PrefixStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  inner_->wait(k(keys), timeout);
}
bool PrefixStore::deleteKey(const std::string& key) { return inner_->deleteKey(k(key)); }
int64_t PrefixStore::numKeys() { return inner_->numKeys(); }
std::vector<Bytes> PrefixStore::multiGet(const std::vector<std::string>& keys, Duration timeout) {
  return inner_->multiGet(k(keys), timeout);
}
void PrefixStore::multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  inner_->multiSet(k(keys), values);
}

}  // namespace ddpl::rdzv
