#include "rendezvous/store/kv_space.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "common/errors.h"

namespace ddpl::rdzv {

int64_t parseCounter(const std::string& key, const Bytes& value) {
  std::string s = toString(value);
  try {
    size_t used = 0;
    int64_t v = std::stoll(s, &used);
    if (used == s.size()) return v;
  } catch (const std::exception&) {
  }
  throw StoreError(
      fmt::format("add on key '{}': its value is not an integer ({} bytes)", key, value.size()));
}

int64_t addCounter(const std::string& key, int64_t old, int64_t delta) {
  int64_t v;
  if (__builtin_add_overflow(old, delta, &v))
    throw StoreError(fmt::format(
        "add on key '{}': {} + {} does not fit a 64-bit counter (range {}..{}); the value "
        "stays {}",
        key, old, delta, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(),
        old));
  return v;
}

void KvSpace::run(Fired& fired) {
  for (auto& [fn, values] : fired) fn(std::move(values));
}

bool KvSpace::presentLocked(const std::string& key) const {
  return data_.count(key) > 0 || queues_.count(key) > 0;
}

KvSpace::Value KvSpace::valueLocked(const std::string& key) const {
  auto it = data_.find(key);
  if (it != data_.end()) return it->second;
  static const Value kEmpty = share({});
  return kEmpty;
}

void KvSpace::collectReadyLocked(const std::string& key, Fired& fired, size_t limit) {
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return;
  std::vector<WaitId> ids = it->second;  // unparkLocked edits the list
  for (WaitId id : ids) {
    if (fired.size() >= limit) break;
    auto w = waiters_.find(id);
    if (w == waiters_.end()) continue;
    bool all = std::all_of(w->second.keys.begin(), w->second.keys.end(),
                           [&](const std::string& k) { return presentLocked(k); });
    if (!all) continue;
    Values values;
    if (w->second.want_values)
      for (const auto& k : w->second.keys) values.push_back(valueLocked(k));
    fired.emplace_back(std::move(w->second.on_ready), std::move(values));
    Waiter done = std::move(w->second);
    unparkLocked(id, done);
  }
}

void KvSpace::unparkLocked(WaitId id, const Waiter& w) {
  waiters_.erase(id);
  for (const auto& k : w.keys) {
    auto it = by_key_.find(k);
    if (it == by_key_.end()) continue;
    auto& ids = it->second;
    ids.erase(std::remove(ids.begin(), ids.end(), id), ids.end());
    if (ids.empty()) by_key_.erase(it);
  }
}

void KvSpace::setShared(const std::string& key, Value value) {
  Fired fired;
  {
    std::lock_guard<std::mutex> lock(mu_);
    data_[key] = std::move(value);
    collectReadyLocked(key, fired);
  }
  run(fired);
}

void KvSpace::multiSet(const std::vector<std::string>& keys, std::vector<Bytes> values) {
  Values shared;
  shared.reserve(values.size());
  for (auto& v : values) shared.push_back(share(std::move(v)));
  multiSetShared(keys, std::move(shared));
}

void KvSpace::multiSetShared(const std::vector<std::string>& keys, Values values) {
  if (keys.size() != values.size())
    throw InvalidArgument(
        fmt::format("multiSet: {} keys but {} values", keys.size(), values.size()));
  Fired fired;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < keys.size(); ++i) data_[keys[i]] = std::move(values[i]);
    for (const auto& k : keys) collectReadyLocked(k, fired);
  }
  run(fired);
}

int64_t KvSpace::add(const std::string& key, int64_t delta) {
  Fired fired;
  int64_t v;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = data_.find(key);
    int64_t old = it == data_.end() ? 0 : parseCounter(key, *it->second);
    if (__builtin_add_overflow(old, delta, &v))
      throw StoreError(
          fmt::format("add on key '{}': {} + {} does not fit a 64-bit counter "
                      "(range {}..{}); the value stays {}",
                      key, old, delta, INT64_MIN, INT64_MAX, old));
    data_[key] = share(toBytes(std::to_string(v)));
    collectReadyLocked(key, fired);
  }
  run(fired);
  return v;
}

Bytes KvSpace::compareSet(const std::string& key, const Bytes& expected, Bytes desired) {
  Fired fired;
  Bytes result;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = data_.find(key);
    if (it == data_.end()) {
      if (!expected.empty()) return expected;  // c10d returns `expected` for a missing key
      result = desired;
      data_[key] = share(std::move(desired));
      collectReadyLocked(key, fired);
    } else if (*it->second == expected) {
      result = desired;
      it->second = share(std::move(desired));
    } else {
      return *it->second;
    }
  }
  run(fired);
  return result;
}

bool KvSpace::check(const std::vector<std::string>& keys) const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::all_of(keys.begin(), keys.end(),
                     [&](const std::string& k) { return presentLocked(k); });
}

bool KvSpace::deleteKey(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  return data_.erase(key) > 0;
}

int64_t KvSpace::numKeys(const std::string& prefix) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (prefix.empty()) return static_cast<int64_t>(data_.size());
  int64_t n = 0;
  for (auto it = data_.lower_bound(prefix);
       it != data_.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it)
    ++n;
  return n;
}

KvSpace::KeyList KvSpace::listKeys(const std::string& prefix, uint64_t max_bytes,
                                   uint64_t per_key_bytes) const {
  KeyList out;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = data_.lower_bound(prefix);
       it != data_.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it) {
    uint64_t cost = per_key_bytes + (it->first.size() - prefix.size());
    ++out.count;
    out.bytes += cost;
    if (out.bytes > max_bytes) out.complete = false;
    if (out.complete) out.keys.push_back(it->first.substr(prefix.size()));
  }
  if (!out.complete) std::vector<std::string>().swap(out.keys);
  return out;
}

int64_t KvSpace::deletePrefix(const std::string& prefix) {
  if (prefix.empty()) throw InvalidArgument("deletePrefix: the prefix is empty");
  std::lock_guard<std::mutex> lock(mu_);
  auto first = data_.lower_bound(prefix);
  auto last = first;
  int64_t n = 0;
  while (last != data_.end() && last->first.compare(0, prefix.size(), prefix) == 0) {
    ++last;
    ++n;
  }
  data_.erase(first, last);
  auto q = queues_.lower_bound(prefix);
  while (q != queues_.end() && q->first.compare(0, prefix.size(), prefix) == 0)
    q = queues_.erase(q);
  return n;
}

KvSpace::Value KvSpace::getShared(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = data_.find(key);
  return it == data_.end() ? nullptr : it->second;
}

void KvSpace::append(const std::string& key, const Bytes& value, size_t max_bytes) {
  Fired fired;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = data_.find(key);
    size_t have = it == data_.end() ? 0 : it->second->size();
    if (value.size() > max_bytes || have > max_bytes - value.size())
      throw StoreError(fmt::format(
          "append on key '{}': {} + {} bytes is more than this store's value limit, {} bytes",
          key, have, value.size(), max_bytes));
    if (it == data_.end()) {
      data_[key] = share(value);
    } else {
      // Values are immutable once stored (readers may hold them): a new one replaces it.
      Bytes joined;
      joined.reserve(it->second->size() + value.size());
      joined.insert(joined.end(), it->second->begin(), it->second->end());
      joined.insert(joined.end(), value.begin(), value.end());
      it->second = share(std::move(joined));
    }
    collectReadyLocked(key, fired);
  }
  run(fired);
}

void KvSpace::queuePush(const std::string& key, Bytes value) {
  Fired fired;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queues_[key].push_back(share(std::move(value)));
    collectReadyLocked(key, fired, 1);
  }
  run(fired);
}

KvSpace::Popped KvSpace::queuePop(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  Popped p;
  auto it = queues_.find(key);
  if (it == queues_.end()) return p;
  p.length_before = static_cast<int64_t>(it->second.size());
  p.value = std::move(it->second.front());
  it->second.pop_front();
  if (it->second.empty()) queues_.erase(it);
  return p;
}

int64_t KvSpace::queueLen(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = queues_.find(key);
  return it == queues_.end() ? 0 : static_cast<int64_t>(it->second.size());
}

std::vector<std::string> KvSpace::missing(const std::vector<std::string>& keys) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (const auto& k : keys)
    if (!presentLocked(k)) out.push_back(k);
  return out;
}

size_t KvSpace::parkedCount() const {
  std::lock_guard<std::mutex> lock(mu_);
  return waiters_.size();
}

KvSpace::WaitStart KvSpace::waitFor(const std::vector<std::string>& keys, bool want_values,
                                    Ready on_ready) {
  auto shared = waitForShared(keys, want_values, [on_ready = std::move(on_ready)](Values v) {
    std::vector<Bytes> copies;
    copies.reserve(v.size());
    for (auto& p : v) copies.push_back(*p);
    on_ready(std::move(copies));
  });
  WaitStart start;
  start.ready = shared.ready;
  start.id = shared.id;
  for (auto& p : shared.values) start.values.push_back(*p);
  return start;
}

KvSpace::SharedStart KvSpace::waitForShared(const std::vector<std::string>& keys, bool want_values,
                                            ReadyShared on_ready) {
  SharedStart start;
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> absent;
  for (const auto& k : keys)
    if (!presentLocked(k)) absent.push_back(k);
  if (absent.empty()) {
    start.ready = true;
    if (want_values)
      for (const auto& k : keys) start.values.push_back(valueLocked(k));
    return start;
  }
  start.id = next_id_++;
  waiters_.emplace(start.id, Waiter{keys, want_values, std::move(on_ready)});
  // Parked under every key, not only the missing ones: a present key may be deleted before
  // the others arrive, and its later set must still wake this waiter.
  std::vector<std::string> unique = keys;
  std::sort(unique.begin(), unique.end());
  unique.erase(std::unique(unique.begin(), unique.end()), unique.end());
  for (const auto& k : unique) by_key_[k].push_back(start.id);
  return start;
}

bool KvSpace::cancelWait(WaitId id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = waiters_.find(id);
  if (it == waiters_.end()) return false;
  Waiter w = std::move(it->second);
  unparkLocked(id, w);
  return true;
}

}  // namespace ddpl::rdzv
