// The etcd backend in a running round: the watch that ends it, the liveness answers, and the
// transaction that moves the state on.
#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "common/errors.h"
#include "common/log.h"
#include "launcher/membership/etcd/etcd_rendezvous_impl.h"

namespace ddpl::launcher::etcd_detail {

void EtcdRendezvous::startWatch(int64_t round, const std::vector<std::string>& members,
                                int64_t rev) {
  std::string state_key = key("state"), places = joinsPrefix(round);
  std::string ping_prefix = fmt::format("{}round/{}/ping/", p_, round);
  std::set<std::string> member_set(members.begin(), members.end());
  watch_ = etcd_->watch(
      {{state_key, ""}, {places, etcdPrefixEnd(places)}, {ping_prefix, etcdPrefixEnd(ping_prefix)}},
      rev + 1,
      [this, round, members, member_set, state_key, places,
       ping_prefix](const std::vector<EtcdEvent>& events) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          // Over for this node: what follows (the others leaving it) is no news.
          if (ended_round_ >= round) return;
        }
        for (const auto& ev : events) {
          if (answerPing(round, ping_prefix, ev)) continue;
          if (finishing_) continue;
          if (ev.kv.key == state_key) {
            if (ev.type == EtcdEvent::Type::kDelete) {
              roundEnded(round, "the job's rendezvous state was deleted from etcd");
              return;
            }
            RoundState s = RoundState::decode(state_key, ev.kv.value);
            if (s.round != round) {
              roundEnded(round, s.reason.empty() ? fmt::format("round {} ended", round) : s.reason);
              return;
            }
          } else if (ev.type == EtcdEvent::Type::kDelete && ev.kv.key.rfind(places, 0) == 0) {
            std::string node = ev.kv.key.substr(places.size());
            if (!member_set.count(node)) continue;  // a node the round did not take
            if (node == c_.node_id) {
              roundEnded(round,
                         "this node's etcd lease expired (no keep-alive got through "
                         "within its TTL)");
              return;
            }
            std::string why =
                fmt::format("node {} lost: its etcd lease expired (no keep-alive for {}s)", node,
                            lease_ttl_.count());
            // One transaction moves the state on; the first member to see the loss wins,
            // the others' compare fails at no further cost.
            int64_t srev;
            {
              std::lock_guard<std::mutex> lock(mu_);
              srev = state_rev_;
            }
            invalidate(round, srev, members, node, why);
            roundEnded(round, why);
            return;
          }
        }
      },
      [this, round](const std::string& why) {
        // No endpoint took the watch over within the connect timeout: etcd is lost (not
        // when its revisions were compacted away, which a reachable etcd says).
        if (why.find("compacted") == std::string::npos) markLost("lost etcd: " + why);
        roundEnded(round, "lost etcd: " + why);
      });
}

bool EtcdRendezvous::answerPing(int64_t round, const std::string& ping_prefix,
                                const EtcdEvent& ev) {
  if (ev.type != EtcdEvent::Type::kPut || ev.kv.key.rfind(ping_prefix, 0) != 0) return false;
  std::string asker = ev.kv.key.substr(ping_prefix.size());
  if (asker == c_.node_id) return true;
  try {
    etcd_->put(fmt::format("{}round/{}/pong/{}/{}", p_, round, asker, c_.node_id), ev.kv.value);
  } catch (const std::exception& e) {
    log::warn("answering node {}'s liveness probe: {}", asker, e.what());
  }
  return true;
}

void EtcdRendezvous::watchPingsOnly() {
  int64_t round, rev;
  {
    std::lock_guard<std::mutex> lock(mu_);
    round = current_->round;
    rev = state_rev_;
  }
  std::string ping_prefix = fmt::format("{}round/{}/ping/", p_, round);
  auto pings = etcd_->watch(
      ping_prefix, etcdPrefixEnd(ping_prefix), rev + 1,
      [this, round, ping_prefix](const std::vector<EtcdEvent>& events) {
        for (const auto& ev : events) answerPing(round, ping_prefix, ev);
      },
      [](const std::string& why) { log::debug("liveness probes: {}", why); });
  watch_ = std::move(pings);
}

bool EtcdRendezvous::invalidate(int64_t round, int64_t srev,
                                const std::vector<std::string>& members, const std::string& lost,
                                const std::string& why) {
  RoundState next;
  next.round = round + 1;
  next.min_nodes = c_.min_nodes;
  next.max_nodes = c_.max_nodes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    next.epoch_ms = epoch_ms_;
  }
  for (const auto& m : members)
    if (m != lost) next.expected.push_back(m);
  next.reason = why;
  try {
    return etcd_
        ->txn({{key("state"), EtcdCompare::Target::kMod, srev}},
              {{EtcdOp::Kind::kPut, key("state"), next.encode()}})
        .succeeded;
  } catch (const std::exception& e) {
    noteTransport(e);
    log::warn("ending round {} in etcd: {}", round, e.what());
    return false;
  }
}

void EtcdRendezvous::roundEnded(int64_t round, const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ended_round_ >= round) return;
    ended_round_ = round;
  }
  cv_.notify_all();
  endRound(round, why);
}

}  // namespace ddpl::launcher::etcd_detail
