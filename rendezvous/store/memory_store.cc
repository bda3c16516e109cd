#include "rendezvous/store/memory_store.h"

#include <fmt/format.h>

#include "common/errors.h"
#include "rendezvous/store/kv_space.h"

namespace ddpl::rdzv {

void MemoryStore::set(const std::string& key, const Bytes& value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    data_[key] = value;
  }
  changed_.notify_all();
}

std::vector<std::string> MemoryStore::waitLocked(std::unique_lock<std::mutex>& lock,
                                                 const std::vector<std::string>& keys,
                                                 Duration timeout) {
  auto missing = [&] {
    std::vector<std::string> m;
    for (const auto& k : keys)
      if (!data_.count(k)) m.push_back(k);
    return m;
  };
  auto deadline = Clock::now() + timeout;
  auto m = missing();
  while (!m.empty()) {
    if (changed_.wait_until(lock, deadline) == std::cv_status::timeout) return missing();
    m = missing();
  }
  return m;
}

Bytes MemoryStore::get(const std::string& key, Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!waitLocked(lock, {key}, timeout).empty())
    throw TimeoutError(
        fmt::format("timed out after {}ms waiting for key '{}'", timeout.count(), key));
  return data_.at(key);
}

int64_t MemoryStore::add(const std::string& key, int64_t delta) {
  int64_t v;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = data_.find(key);
    v = addCounter(key, it == data_.end() ? 0 : parseCounter(key, it->second), delta);
    data_[key] = toBytes(std::to_string(v));
  }
  changed_.notify_all();
  return v;
}

Bytes MemoryStore::compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) {
  Bytes result;
  bool changed = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = data_.find(key);
    if (it == data_.end()) {
      if (expected.empty()) {
        data_[key] = desired;
        changed = true;
        result = desired;
      } else {
        result = expected;  // c10d returns `expected` when the key is missing
      }
    } else if (it->second == expected) {
      it->second = desired;
      changed = true;
      result = desired;
    } else {
      result = it->second;
    }
  }
  if (changed) changed_.notify_all();
  return result;
}

bool MemoryStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& k : keys)
    if (!data_.count(k)) return false;
  return true;
}

void MemoryStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  auto missing = waitLocked(lock, keys, timeout);
  if (!missing.empty())
    throw TimeoutError(fmt::format("timed out after {}ms waiting for {}/{} keys: {}",
                                   timeout.count(), missing.size(), keys.size(),
                                   quoteKeys(missing)));
}

bool MemoryStore::deleteKey(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  return data_.erase(key) > 0;
}

int64_t MemoryStore::numKeys() {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(data_.size());
}

std::vector<Bytes> MemoryStore::multiGet(const std::vector<std::string>& keys, Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  auto missing = waitLocked(lock, keys, timeout);
  if (!missing.empty())
    throw TimeoutError(fmt::format("timed out after {}ms in multiGet waiting for {}/{} keys: {}",
                                   timeout.count(), missing.size(), keys.size(),
                                   quoteKeys(missing)));
  std::vector<Bytes> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(data_.at(k));
  return out;
}

void MemoryStore::multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  if (keys.size() != values.size())
    throw InvalidArgument(
        fmt::format("multiSet: {} keys but {} values", keys.size(), values.size()));
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < keys.size(); ++i) data_[keys[i]] = values[i];
  }
  changed_.notify_all();
}

}  // namespace ddpl::rdzv
