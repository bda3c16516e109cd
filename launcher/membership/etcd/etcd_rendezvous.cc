// The etcd rendezvous: the rounds of rendezvous/state/rendezvous_state.h, kept in etcd instead of
// in one process. No node hosts anything. Every change of the round's state is a transaction that
// compares the state's mod revision (of two agents racing, exactly one wins); changes are
// learnt through watches.
//
// Built to cost each agent a constant number of etcd operations per round, whatever the
// number of agents (docs/benchmarks.md, "The etcd backend": one shared state key that every
// joiner rewrote made joins O(N^2) conflicting transactions and O(N^2) re-reads, and 256
// agents never formed):
// - A joiner writes a key of its own, joins/<round>/<node>, in a transaction that only checks
//   that the state is still the one it read: joiners never conflict with each other.
// - One joiner, the one whose key is oldest (lowest create revision), counts the joiners and
//   closes the round: a single transaction that writes the complete state, and succeeds only
//   if no joiner came or went since its count (seq/<round>, which every join and leave
//   touches, is compared). The others wait on two keys (the state, and that joiner's key, in
//   case it goes) and are woken once, when the round completes.
// - The nodes of a running round watch only the state, their round's joins/ and its pings.
//
// Keys, under P = <prefix>/<run_id>/:
//   P state                   the round: number, phase (joining/complete), nodes (complete:
//                             sorted by node id: group ranks), nodes expected back, why the
//                             last round ended
//   P joins/<round>/<node>    a node's place in a round (its nproc and address), attached to
//                             the node's lease: it vanishes when the node's keep-alives stop
//                             for the lease's TTL (SIGKILL, power loss) or at once when the
//                             node revokes it
//   P seq/<round>             touched by every join and leave of a forming round
//   P failures, last_failure  the job-wide restart count and the last root cause
//   P round/<n>/...           master_port (published by group rank 0); the exit barrier's
//                             done/<node> and end; gone/<node> (the last node gone deletes all
//                             of P); ping/<node>, pong/<node>/<peer>: a node whose workers
//                             failed asks the others to prove they are alive
//   P status/, stacks/, preflight/   the job's health across nodes (multi_node_rendezvous.h)
#include "launcher/membership/etcd/etcd_rendezvous.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "common/errors.h"
#include "common/log.h"
#include "common/parse.h"
#include "launcher/membership/etcd/etcd_job_kv.h"
#include "launcher/membership/etcd/etcd_rendezvous_impl.h"
#include "launcher/membership/ports.h"

namespace ddpl::launcher {
namespace etcd_detail {

std::string seconds(milliseconds d) { return fmt::format("{:.0f}s", d.count() / 1000.0); }

EtcdRendezvous::EtcdRendezvous(const EtcdRendezvousConfig& c)
    : MultiNodeRendezvous(c.rounds.node_id), c_(c.rounds), lease_ttl_(c.lease_ttl) {
  etcd_ = std::make_unique<EtcdClient>(c.etcd);
  std::string prefix = c.prefix;
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  p_ = prefix + "/" + c_.run_id + "/";
  setKv(makeEtcdJobKv(etcd_.get(), p_));
  if (!c_.local_addr.empty()) {
    address_ = c_.local_addr;
  } else {
    HostPort hp = parseHostPort("etcd endpoint", c.etcd.endpoints.front(), 2379);
    address_ = routeAddressTo(hp.host, hp.port);
  }
  lease_ = etcd_->grantLease(lease_ttl_);
  keeper_ = etcd_->keepAlive(
      lease_, lease_ttl_, [this](int64_t id) { return leaseExpired(id); },
      [this](milliseconds silent) { fence(silent); });
  log::info("rendezvous in etcd at {} under '{}', node '{}' at {}, {}:{} nodes, lease TTL {}s",
            etcd_->endpoints(), p_, c_.node_id, address_, c_.min_nodes, c_.max_nodes,
            lease_ttl_.count());
}

EtcdRendezvous::~EtcdRendezvous() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  join_cancel_.cancel();
  stopThreads();
  watch_.reset();
  keeper_.reset();
}

bool EtcdRendezvous::roundStillCurrent() {
  std::optional<WorldAssignment> cur;
  std::vector<std::string> members;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!current_) return true;
    if (ended_round_ >= current_->round) return false;
    cur = current_;
    members = members_;
  }
  if (cur->group_world_size <= 1) return true;
  // A worker that failed may have failed of another node's death (its peers' connections
  // broke), which etcd tells only when that node's lease expires. Rather than wait out the
  // TTL on every failure, ask the other members to prove they are alive: each answers from
  // its round watch within milliseconds. All answer: a real failure, counted now. One does
  // not (killed, stopped, cut off): its lease expires within the TTL and the round ends,
  // which is a membership change, not a failure of the job.
  try {
    std::string probe = std::to_string(etcd_->add(key("probes"), 1));
    clearLost();  // etcd answers (again): recordFailure(), which follows, goes by that
    std::string answers = fmt::format("{}round/{}/pong/{}/", p_, cur->round, c_.node_id);
    int64_t rev = etcd_->put(fmt::format("{}round/{}/ping/{}", p_, cur->round, c_.node_id), probe);
    auto deadline = Clock::now() + lease_ttl_ + std::chrono::seconds(2);
    while (true) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (ended_round_ >= cur->round) return false;
      }
      std::set<std::string> alive;
      for (const auto& kv : etcd_->getPrefix(answers, &rev))
        if (kv.value == probe) alive.insert(kv.key.substr(answers.size()));
      bool all = std::all_of(members.begin(), members.end(), [&](const std::string& m) {
        return m == c_.node_id || alive.count(m);
      });
      if (all) return true;
      auto now = Clock::now();
      if (now >= deadline) break;
      // Short waits: the round's end arrives through the round watch, not this one.
      etcd_->waitForEvent(
          answers, etcdPrefixEnd(answers), rev + 1,
          std::min(milliseconds(500), std::chrono::duration_cast<milliseconds>(deadline - now)));
    }
    auto kv = etcd_->get(key("state"));
    if (!kv) return false;
    RoundState s = RoundState::decode(key("state"), kv->value);
    return s.round == cur->round && s.complete && s.has(c_.node_id);
  } catch (const std::exception& e) {
    noteTransport(e);
    log::debug("cannot tell whether round {} is current ({}): counting the failure", cur->round,
               e.what());
    return true;
  }
}

bool EtcdRendezvous::finish(bool success) {
  finishing_ = true;      // members leaving after the job is done end nothing; a join gives up
  join_cancel_.cancel();  // at once, if it is waiting
  stopHealth();           // nothing is published for a node on its way out
  waitForJoiner();        // place_ is the joiner's until then
  bool job_ok = true;
  if (success && current_ &&
      mayCall(Clock::time_point::max(), "waiting for the other nodes to finish")) {
    try {
      watchPingsOnly();
      auto end = exitBarrier(current_->round, current_->group_world_size, c_.exit_barrier_timeout);
      if (!end)
        log::warn("other nodes did not finish within the exit barrier ({}); leaving anyway",
                  seconds(c_.exit_barrier_timeout));
      else
        job_ok = *end == "done";
      job_done_ = end && *end == "done";
    } catch (const std::exception& e) {
      noteTransport(e);
      log::warn("exit barrier: {}", e.what());
    }
  }
  // Kept through the barrier to answer other nodes' probes (roundStillCurrent): a node done
  // here is alive, whatever its workers' state.
  watch_.reset();
  // Leaving, the outcome, "gone" and the lease share one call timeout: etcd lost on the way
  // out costs at most about that, not a call timeout per call (five of them).
  close_by_ = Clock::now() + etcd_->options().call_timeout;
  leaveQuietly(fmt::format("node {} left", c_.node_id));
  if (current_ && mayCall(close_by_, "closing the rendezvous")) {
    try {
      cached_failure_ = jobFailure();  // read before the last node clears it
      if (countGone(current_->round) >= current_->group_world_size) {
        // Every node of the job's last round is done with it: its keys must not outlive it
        // (a job re-run under the same id would start "already failed"). A node SIGKILLed
        // never gets here; its leased keys go with its lease, the rest stays.
        int64_t n = etcd_->deletePrefix(p_);
        log::debug("the job's last node out: deleted its {} key(s) under '{}'", n, p_);
      }
    } catch (const std::exception& e) {
      noteTransport(e);
      log::warn("closing the rendezvous: {}", e.what());
    }
  }
  revokeLease();
  return job_ok;
}

void EtcdRendezvous::stopBeforeJoining(const std::string& reason) {
  // The nodes joining read and watch the state: the stop goes into it, so that they learn
  // it at once, and those still to come when they read it (within a join timeout).
  constexpr size_t kMaxReason = 2000;
  std::string why = reason.size() > kMaxReason ? reason.substr(0, kMaxReason) + "..." : reason;
  try {
    for (int tries = 0;; ++tries) {
      auto kv = etcd_->get(key("state"));
      RoundState s;
      int64_t srev = 0;
      if (kv) {
        s = RoundState::decode(key("state"), kv->value);
        checkConfig(s);
        srev = kv->mod_revision;
      } else {
        s.min_nodes = c_.min_nodes;  // round 0, opened by its first node: this one
        s.max_nodes = c_.max_nodes;
      }
      if (s.complete) {
        log::info("round {} runs without this node; the next round is not held to its stop",
                  s.round);
        break;
      }
      double now = unixNow();
      s.stopped = s.stops(now);
      s.stopped[c_.node_id] = why;
      s.stopped_until = std::max(s.stopped_until, now + c_.join_timeout.count() / 1000.0);
      auto r = etcd_->txn({{key("state"), EtcdCompare::Target::kMod, srev}},
                          {{EtcdOp::Kind::kPut, key("state"), s.encode()}});
      if (r.succeeded) {
        int can_come = c_.max_nodes - static_cast<int>(s.stopped.size());
        if (can_come < c_.min_nodes)
          log::error(
              "the job cannot form without this node ({} of --nnodes={}:{} can still "
              "come): the other nodes are told",
              std::max(can_come, 0), c_.min_nodes, c_.max_nodes);
        else
          log::info(
              "the other nodes go on without this node ({} of --nnodes={}:{} can still "
              "come)",
              can_come, c_.min_nodes, c_.max_nodes);
        break;
      }
      // Another node changed the state meanwhile (joined, closed the round): read it again.
      if (tries >= 100) throw StoreError("100 conflicting writes of the state in a row");
    }
  } catch (const std::exception& e) {
    log::warn(
        "cannot tell the other nodes that this node stops: {} (they wait up to the join "
        "timeout, {}, for it)",
        e.what(), seconds(c_.join_timeout));
  }
  revokeLease();
}

void EtcdRendezvous::leaveQuietly(const std::string& why) {
  std::optional<WorldAssignment> cur;
  std::vector<std::string> members;
  int64_t srev;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (left_ || !current_) return;
    left_ = true;
    cur = current_;
    members = members_;
    srev = state_rev_;
  }
  watch_.reset();
  if (!mayCall(close_by_, "leaving the rendezvous")) return;  // the lease expires instead
  // The others re-form at once instead of waiting out this node's lease.
  if (!job_done_) invalidate(cur->round, srev, members, c_.node_id, why);
  try {
    if (!place_.empty() && mayCall(close_by_, "giving up this node's place"))
      etcd_->txn({}, {{EtcdOp::Kind::kDelete, place_}});
    place_.clear();
    place_round_ = -1;
  } catch (const std::exception& e) {
    noteTransport(e);
    log::warn("leaving the rendezvous: {}", e.what());
  }
}

void EtcdRendezvous::noteTransport(const std::exception& e) {
  if (dynamic_cast<const NetworkError*>(&e)) markLost(e.what());
}

void EtcdRendezvous::revokeLease() {
  int64_t id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    id = lease_;
  }
  cv_.notify_all();
  keeper_.reset();
  if (!mayCall(close_by_, "revoking this node's etcd lease")) return;  // it expires in a TTL
  try {
    etcd_->revokeLease(id);
  } catch (const std::exception& e) {
    log::warn("revoking this node's etcd lease: {} (it expires within {}s)", e.what(),
              lease_ttl_.count());
  }
}

int64_t EtcdRendezvous::renewLease(int64_t expired) {
  std::lock_guard<std::mutex> renewing(renew_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (lease_ != expired) return lease_;
  }
  int64_t fresh = etcd_->grantLease(lease_ttl_);
  std::lock_guard<std::mutex> lock(mu_);
  lease_ = fresh;
  return fresh;
}

void EtcdRendezvous::fence(milliseconds silent) {
  // Members of a running round only: a joining node has no workers to stop.
  std::optional<int64_t> round;
  double within = std::chrono::duration<double>(lease_ttl_).count() / 6;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (current_ && !finishing_ && !stop_ && ended_round_ < current_->round)
      round = current_->round;
  }
  if (!round) return;
  markFenced(*round, within);
  std::string why = fmt::format(
      "fencing: no etcd keep-alive answered for {:.1f}s (limit {:.1f}s, 2/3 of the lease TTL "
      "of {}s): the workers of round {} stop within {:.1f}s, before etcd can let the others "
      "re-form without this node",
      silent.count() / 1000.0, 2.0 * std::chrono::duration<double>(lease_ttl_).count() / 3,
      lease_ttl_.count(), *round, within);
  markLost(why);
  roundEnded(*round, why);
}

int64_t EtcdRendezvous::leaseExpired(int64_t id) {
  log::warn("this node's etcd lease {:x} expired: the other nodes dropped it", id);
  std::optional<int64_t> round;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (current_) round = current_->round;
  }
  if (round && !finishing_)
    roundEnded(*round, "this node's etcd lease expired (no keep-alive got through within its TTL)");
  return renewLease(id);
}

}  // namespace etcd_detail

std::unique_ptr<RendezvousHandler> makeEtcdRendezvous(const EtcdRendezvousConfig& config) {
  return std::make_unique<etcd_detail::EtcdRendezvous>(config);
}

}  // namespace ddpl::launcher
