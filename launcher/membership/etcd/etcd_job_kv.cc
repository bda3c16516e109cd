#include "launcher/membership/etcd/etcd_job_kv.h"

#include "common/log.h"

namespace ddpl::launcher::etcd_detail {
namespace {

class EtcdJobKv : public JobKv {
 public:
  EtcdJobKv(EtcdClient* etcd, std::string p) : etcd_(etcd), p_(std::move(p)) {}
  int64_t add(const std::string& key, int64_t delta) override {
    return etcd_->add(p_ + key, delta);
  }
  void set(const std::string& key, const std::string& value) override {
    etcd_->put(p_ + key, value);
  }
  std::optional<std::string> get(const std::string& key) override {
    auto kv = etcd_->get(p_ + key);
    if (!kv) return std::nullopt;
    return kv->value;
  }
  // One key per node: no counter for every node to fight over.
  void append(const std::string& list, const std::string& node, const std::string& value) override {
    etcd_->put(p_ + list + "/" + node, value);
  }
  // A key per node and a count: puts are linearized, so of nodes racing, the last to put
  // counts them all.
  int64_t tally(const std::string& key, const std::string& node) override {
    std::string prefix = p_ + key + "/";
    etcd_->put(prefix + node, "1");
    EtcdRange r;
    r.key = prefix;
    r.range_end = etcdPrefixEnd(prefix);
    r.count_only = true;
    return etcd_->range(r).count;
  }
  std::optional<std::string> waitFor(const std::string& key,
                                     std::chrono::milliseconds timeout) override {
    return waitForEtcdKey(etcd_, p_ + key, timeout);
  }
  std::vector<std::string> readNew(const std::string& list, int64_t* cursor) override {
    EtcdRange r;
    r.key = p_ + list + "/";
    r.range_end = etcdPrefixEnd(r.key);
    r.min_mod_revision = *cursor + 1;
    auto got = etcd_->range(r);
    std::vector<std::string> out;
    for (const auto& kv : got.kvs) out.push_back(kv.value);
    *cursor = got.revision;
    return out;
  }
  std::unique_ptr<Subscription> subscribe(const std::string& prefix,
                                          std::function<void()> changed) override {
    struct Watched : Subscription {
      std::unique_ptr<EtcdWatch> watch;
    };
    int64_t rev = 0;
    etcd_->get(p_ + prefix, &rev);
    auto w = std::make_unique<Watched>();
    w->watch = etcd_->watch(
        p_ + prefix, etcdPrefixEnd(p_ + prefix), rev + 1,
        [changed](const std::vector<EtcdEvent>&) { changed(); },
        [](const std::string& why) { log::debug("job health: {}", why); });
    return w;
  }

 private:
  EtcdClient* etcd_;
  std::string p_;
};

}  // namespace

std::optional<std::string> waitForEtcdKey(EtcdClient* etcd, const std::string& key,
                                          std::chrono::milliseconds timeout) {
  using std::chrono::milliseconds;
  using Clock = std::chrono::steady_clock;
  auto deadline = Clock::now() + timeout;
  while (true) {
    int64_t rev = 0;
    auto kv = etcd->get(key, &rev);
    if (kv) return kv->value;
    auto now = Clock::now();
    if (now >= deadline) return std::nullopt;
    etcd->waitForEvent(key, "", rev + 1,
                       std::chrono::duration_cast<milliseconds>(deadline - now) + milliseconds(1));
  }
}

std::unique_ptr<JobKv> makeEtcdJobKv(EtcdClient* etcd, std::string prefix) {
  return std::make_unique<EtcdJobKv>(etcd, std::move(prefix));
}

}  // namespace ddpl::launcher::etcd_detail
