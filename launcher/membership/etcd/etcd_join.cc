// The etcd backend forming a round: taking a place, counting the places, closing the round,
// and the assignment that follows (etcd_rendezvous.cc describes the keys).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <set>
#include <thread>

#include "common/errors.h"
#include "common/log.h"
#include "common/parse.h"
#include "launcher/membership/etcd/etcd_job_kv.h"
#include "launcher/membership/etcd/etcd_rendezvous_impl.h"
#include "launcher/membership/ports.h"
#include "rendezvous/state/rendezvous_state.h"
#include "rendezvous/state/round_rules.h"

namespace ddpl::launcher::etcd_detail {

void EtcdRendezvous::checkConfig(const RoundState& s) const {
  if (s.min_nodes != c_.min_nodes || s.max_nodes != c_.max_nodes)
    throw InvalidArgument(fmt::format(
        "run '{}' in etcd is for {}:{} nodes but this node says --nnodes={}:{}: every node "
        "of a job must give the same --nnodes",
        c_.run_id, s.min_nodes, s.max_nodes, c_.min_nodes, c_.max_nodes));
}

bool EtcdRendezvous::takePlace(int64_t round, int64_t srev, const RoundState* open) {
  int64_t l = lease();
  std::vector<EtcdOp> ops;
  if (open) ops.push_back({EtcdOp::Kind::kPut, key("state"), open->encode()});
  ops.push_back({EtcdOp::Kind::kPut, joinKey(round, c_.node_id), encodeJoin(me()), l});
  ops.push_back({EtcdOp::Kind::kPut, seqKey(round), c_.node_id});
  if (!place_.empty() && place_ != joinKey(round, c_.node_id))
    ops.push_back({EtcdOp::Kind::kDelete, place_});
  EtcdTxnResult r;
  try {
    r = etcd_->txn({{key("state"), EtcdCompare::Target::kMod, srev}}, ops);
  } catch (const StoreError& e) {
    // The lease expired (the agent was stopped past its TTL) and the keep-alive thread has
    // not replaced it yet: replace it here, and try again.
    if (std::string(e.what()).find("lease not found") == std::string::npos) throw;
    keeper_->keep(renewLease(l), lease_ttl_);
    return false;
  }
  if (!r.succeeded) return false;
  place_ = joinKey(round, c_.node_id);
  place_round_ = round;
  place_lease_ = l;
  return true;
}

void EtcdRendezvous::givePlace() {
  if (place_.empty()) return;
  try {
    etcd_->txn({}, {{EtcdOp::Kind::kDelete, place_},
                    {EtcdOp::Kind::kPut, seqKey(place_round_), c_.node_id}});
  } catch (const std::exception& e) {
    log::warn("giving up this node's place in round {}: {}", place_round_, e.what());
  }
  place_.clear();
  place_round_ = -1;
}

std::optional<WorldAssignment> EtcdRendezvous::joinOnce() {
  auto deadline = Clock::now() + c_.join_timeout;
  std::mt19937_64 rng(std::hash<std::string>{}(c_.node_id) ^
                      Clock::now().time_since_epoch().count());
  for (int tries = 1;; ++tries) {
    try {
      assigning_ = false;
      auto w = joinUntil(deadline, rng);
      clearLost();  // etcd answers (again)
      return w;
    } catch (const NetworkError& e) {
      markLost(e.what());
      if (assigning_ || Clock::now() >= deadline) throw;
      checkStop();
      log::warn("joining: {} (try {}; trying again, within the join timeout of {})", e.what(),
                tries, seconds(c_.join_timeout));
      auto pause = milliseconds(std::uniform_int_distribution<int>(1000, 3000)(rng));
      for (auto until = Clock::now() + pause; Clock::now() < until && Clock::now() < deadline;)
        std::this_thread::sleep_for(milliseconds(100));
      checkStop();
    }
  }
}

std::optional<WorldAssignment> EtcdRendezvous::joinUntil(Clock::time_point deadline,
                                                         std::mt19937_64& rng) {
  if (auto over = failedForGood(c_.run_id, c_.max_restarts)) return over;
  bool told_full = false;
  while (true) {
    checkStop();
    int64_t rev = 0;
    auto kv = etcd_->get(key("state"), &rev);
    if (!kv) {
      // The first node of the run opens round 0.
      RoundState s;
      s.min_nodes = c_.min_nodes;
      s.max_nodes = c_.max_nodes;
      s.epoch_ms = static_cast<int64_t>(unixNow() * 1000);
      takePlace(0, 0, &s);
      continue;
    }
    RoundState s = RoundState::decode(key("state"), kv->value);
    checkConfig(s);
    {
      std::lock_guard<std::mutex> lock(mu_);
      epoch_ms_ = s.epoch_ms;
    }
    if (!s.complete) {
      // A node stopped before joining and min nodes can no longer come: fail now, not at
      // the join timeout (stopBeforeJoining() wrote the state, which wakes every wait here).
      std::string why =
          rdzv::cannotFormMessage(c_.run_id, s.round, s.min_nodes, s.max_nodes, s.stops(unixNow()));
      if (!why.empty()) {
        givePlace();
        throw StoreError(why);
      }
    }
    const int64_t srev = kv->mod_revision;
    int64_t ended;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ended = ended_round_;
    }
    if (s.complete && s.has(c_.node_id) && s.round > ended) return assigned(s, srev);
    if (s.complete) {
      if (s.has(c_.node_id) || static_cast<int>(s.nodes.size()) >= c_.max_nodes) {
        // Full, or the round this node just saw end and that its ender has yet to move on
        // (one transaction away): wait for the state to change.
        if (!s.has(c_.node_id)) {
          if (place_round_ == s.round) givePlace();
          if (!told_full) {
            told_full = true;
            log::info("round {} is full ({} nodes): waiting for the next one", s.round,
                      s.nodes.size());
          }
        } else if (s.round <= ended && waitedOnEnded(s)) {
          continue;
        }
        // Waiting on an ended round's ender: back within a lease TTL, to move it on if
        // the ender died meanwhile (waitedOnEnded).
        std::optional<Clock::time_point> until;
        if (s.has(c_.node_id) && ended_since_)
          until = *ended_since_ + lease_ttl_ + milliseconds(100);
        waitOrTimeout(deadline, {{key("state"), ""}}, rev, s, until);
        continue;
      }
      // A complete round with room: end it, and take a place in the next, in one
      // transaction, so that everyone re-joins with this node.
      RoundState next;
      next.round = s.round + 1;
      next.min_nodes = c_.min_nodes;
      next.max_nodes = c_.max_nodes;
      next.epoch_ms = s.epoch_ms;
      for (const auto& n : s.nodes) next.expected.push_back(n.id);
      next.reason = fmt::format("node {} wants to join (round {} has {}/{} nodes)", c_.node_id,
                                s.round, s.nodes.size(), s.max_nodes);
      if (!takePlace(next.round, srev, &next)) backoff(rng);
      continue;
    }
    // A forming round: take a place (once per round, and again if the lease that held it
    // expired), then wait for it to complete, or close it if this node counts.
    if (place_round_ != s.round || place_lease_ != lease()) {
      if (!takePlace(s.round, srev)) backoff(rng);
      continue;
    }
    if (auto w = inFormingRound(s, srev, rev, deadline)) return w;
  }
}

std::optional<WorldAssignment> EtcdRendezvous::inFormingRound(const RoundState& s, int64_t srev,
                                                              int64_t rev,
                                                              Clock::time_point deadline) {
  EtcdRange oldest;
  oldest.key = joinsPrefix(s.round);
  oldest.range_end = etcdPrefixEnd(oldest.key);
  oldest.oldest_first = true;
  oldest.limit = 1;
  oldest.keys_only = true;
  auto first = etcd_->range(oldest);
  noteJoined(s.round, first.count);  // the whole range's, whatever the limit
  // Even this node's place is gone (its lease expired): re-join.
  if (first.kvs.empty()) {
    place_round_ = -1;
    return std::nullopt;
  }
  if (first.kvs.front().key == place_) return closeRound(s, srev, deadline);
  // This node's place may be gone already with its lease (expired while etcd was too
  // slow to renew it): then it takes a place again before it waits.
  EtcdRange mine;
  mine.key = place_;
  mine.keys_only = true;
  auto own = etcd_->range(mine);
  if (own.kvs.empty() || own.kvs.front().lease != place_lease_) {
    place_round_ = -1;
    return std::nullopt;
  }
  // Woken when the state changes (the round completes), the counting node goes, or this
  // node's place does (the wait is not cut into slices that would notice it otherwise).
  waitOrTimeout(deadline, {{key("state"), ""}, {first.kvs.front().key, ""}, {place_, ""}}, rev, s);
  return std::nullopt;
}

bool EtcdRendezvous::waitedOnEnded(const RoundState& s) {
  if (!ended_since_) ended_since_ = Clock::now();
  if (Clock::now() - *ended_since_ < lease_ttl_) return false;
  ended_since_.reset();
  int64_t srev;
  std::vector<std::string> members;
  {
    std::lock_guard<std::mutex> lock(mu_);
    srev = state_rev_;
    members = members_;
  }
  return invalidate(s.round, srev, members, "", "round " + std::to_string(s.round) + " ended");
}

void EtcdRendezvous::waitOrTimeout(Clock::time_point deadline,
                                   const std::vector<std::pair<std::string, std::string>>& ranges,
                                   int64_t rev, const RoundState& s,
                                   std::optional<Clock::time_point> until) {
  auto now = Clock::now();
  if (now >= deadline) timedOut(s);
  auto end = std::min(deadline, until.value_or(deadline));
  // One watch stream for the whole wait, however long: each new one costs etcd a watcher
  // that catches up from `rev` (with 5 s slices, 1024 joiners made 16 watch streams and 37
  // reads each). A stopping agent ends it through join_cancel_.
  etcd_->waitForEvent(ranges, rev + 1,
                      std::chrono::duration_cast<milliseconds>(end - now) + milliseconds(1),
                      &join_cancel_);
}

void EtcdRendezvous::noteJoined(int64_t round, int64_t n) {
  if (round != seen_round_) {
    seen_round_ = round;
    seen_joined_ = 0;
  }
  seen_joined_ = std::max(seen_joined_, n);
}

void EtcdRendezvous::timedOut(const RoundState& s) {
  int64_t joined = s.round == seen_round_ ? seen_joined_ : 0;
  try {
    EtcdRange r;
    r.key = joinsPrefix(s.round);
    r.range_end = etcdPrefixEnd(r.key);
    r.count_only = true;
    joined = std::max(joined, etcd_->range(r).count);
  } catch (const std::exception&) {
  }
  givePlace();
  throw TimeoutError(fmt::format(
      "timed out after {} waiting for round {} of run '{}' to form in etcd: {}/{} nodes "
      "joined (--nnodes={}:{})",
      seconds(c_.join_timeout), s.round, c_.run_id, joined, c_.min_nodes, c_.min_nodes,
      c_.max_nodes));
}

void EtcdRendezvous::backoff(std::mt19937_64& rng) {
  std::this_thread::sleep_for(milliseconds(std::uniform_int_distribution<int>(1, 20)(rng)));
}

std::optional<WorldAssignment> EtcdRendezvous::closeRound(const RoundState& s, int64_t srev,
                                                          Clock::time_point deadline) {
  const std::string prefix = joinsPrefix(s.round);
  std::map<std::string, EtcdKv> places;  // by key
  int64_t seen = 0;                      // the revision `places` is as of
  std::optional<Clock::time_point> last_call_at;
  bool told_holding = false;
  auto readAll = [&] {
    EtcdRange r;
    r.key = prefix;
    r.range_end = etcdPrefixEnd(prefix);
    auto got = etcd_->range(r);
    places.clear();
    for (auto& kv : got.kvs) places[kv.key] = std::move(kv);
    seen = got.revision;
  };
  readAll();
  if (stateRevision() != srev) return std::nullopt;  // closed (or moved on) before the read
  while (true) {
    checkStop();
    noteJoined(s.round, static_cast<int64_t>(places.size()));
    if (places.find(place_) == places.end()) return std::nullopt;  // lost this node's place
    // The first max nodes to take a place, by create revision; the rest wait for the next.
    std::vector<const EtcdKv*> order;
    for (const auto& [k, kv] : places) order.push_back(&kv);
    std::sort(order.begin(), order.end(), [](const EtcdKv* a, const EtcdKv* b) {
      return a->create_revision < b->create_revision;
    });
    if (order.front()->key != place_) return std::nullopt;  // an older place: it counts
    if (static_cast<int>(order.size()) > c_.max_nodes) order.resize(c_.max_nodes);
    std::set<std::string> in;
    for (const auto* kv : order) in.insert(kv->key.substr(prefix.size()));
    int n = static_cast<int>(order.size());
    rdzv::round_rules::FormingRound forming;
    forming.joined = n;
    forming.min_nodes = c_.min_nodes;
    // Nodes that stopped before joining will not come: no waiting for them.
    forming.can_come = c_.max_nodes - static_cast<int>(s.stops(unixNow()).size());
    forming.all_expected_back =
        !s.expected.empty() && std::all_of(s.expected.begin(), s.expected.end(),
                                           [&](const std::string& e) { return in.count(e) > 0; });
    bool now = rdzv::round_rules::closesNow(rdzv::round_rules::closing(forming));
    if (n >= c_.min_nodes && !last_call_at) last_call_at = Clock::now() + c_.last_call_timeout;
    if (n < c_.min_nodes) last_call_at.reset();
    bool closing = now || (last_call_at && Clock::now() >= *last_call_at);
    bool waited = false;
    if (closing && waitForHolders(s, in, deadline, &told_holding)) {
      closing = false;
      waited = true;  // catch up below at once
    }
    if (closing) {
      if (auto w = writeClosed(s, srev, seen, order, places.size())) return w;
      if (stateRevision() != srev) return std::nullopt;
      // Places changed since the count: catch up below, without waiting.
    } else if (!waited) {
      waitOrTimeout(deadline, {{key("state"), ""}, {prefix, etcdPrefixEnd(prefix)}}, seen, s,
                    last_call_at);
    }
    // What changed since `seen`: new and rewritten places (their revisions), and the count,
    // which tells whether one went (a lease expired, a node left): then read them all.
    EtcdRange r;
    r.key = prefix;
    r.range_end = etcdPrefixEnd(prefix);
    r.min_mod_revision = seen + 1;
    auto got = etcd_->range(r);
    for (auto& kv : got.kvs) places[kv.key] = std::move(kv);
    seen = got.revision;
    if (got.count != static_cast<int64_t>(places.size())) readAll();
    if (stateRevision() != srev) return std::nullopt;
  }
}

// A member of the ended round that has neither re-joined nor left still holds its place
// there, kept by its lease: it may be cut off from etcd with its workers training on. The round
// closes without it only once that place is gone (the node re-joined, left, or its lease
// expired: by then its agent fenced and its workers are gone). True: it waited for such places.
bool EtcdRendezvous::waitForHolders(const RoundState& s, const std::set<std::string>& in,
                                    Clock::time_point deadline, bool* told) {
  const std::string prefix = joinsPrefix(s.round);
  int64_t held_rev = 0;
  std::vector<std::string> holding = stillHolding(s, in, &held_rev);
  if (holding.empty()) return false;
  if (!*told) {
    *told = true;
    log::info(
        "round {} waits up to {}s for node(s) {} of round {} to re-join or lose their "
        "place (their workers may still train, cut off from etcd)",
        s.round, lease_ttl_.count(), fmt::join(holding, ", "), s.round - 1);
  }
  std::vector<std::pair<std::string, std::string>> ranges = {{key("state"), ""},
                                                             {prefix, etcdPrefixEnd(prefix)}};
  for (const auto& h : holding) ranges.push_back({joinKey(s.round - 1, h), ""});
  waitOrTimeout(deadline, ranges, held_rev, s, Clock::now() + lease_ttl_ + milliseconds(100));
  return true;
}

// Closes forming round `s` with the places in `order` (of `taken`), only if the state is the
// one read (`srev`) and no node took or gave up a place since the count (`seen`; a node's lease
// expiring is the one change that does not touch seq: closeRound catches up with it).
std::optional<WorldAssignment> EtcdRendezvous::writeClosed(const RoundState& s, int64_t srev,
                                                           int64_t seen,
                                                           const std::vector<const EtcdKv*>& order,
                                                           size_t taken) {
  const std::string prefix = joinsPrefix(s.round);
  RoundState done = s;
  done.complete = true;
  done.stopped.clear();  // they concerned the forming round only
  done.stopped_until = 0;
  done.nodes.clear();
  for (const auto* kv : order)
    done.nodes.push_back(decodeJoin(kv->key, kv->key.substr(prefix.size()), kv->value));
  std::sort(done.nodes.begin(), done.nodes.end(),
            [](const NodeEntry& a, const NodeEntry& b) { return a.id < b.id; });
  auto r = etcd_->txn(
      {{key("state"), EtcdCompare::Target::kMod, srev},
       {seqKey(s.round), EtcdCompare::Target::kMod, seen + 1, "", EtcdCompare::Result::kLess}},
      {{EtcdOp::Kind::kPut, key("state"), done.encode()}});
  if (!r.succeeded) return std::nullopt;
  log::debug("closed round {} with {} of {} node(s) that took a place", s.round, order.size(),
             taken);
  return assigned(done, r.revision, true);
}

std::vector<std::string> EtcdRendezvous::stillHolding(const RoundState& s,
                                                      const std::set<std::string>& in,
                                                      int64_t* rev) {
  std::vector<std::string> out;
  if (s.round == 0 || s.expected.empty()) return out;
  EtcdRange r;
  r.key = joinsPrefix(s.round - 1);
  r.range_end = etcdPrefixEnd(r.key);
  r.keys_only = true;
  auto got = etcd_->range(r);
  *rev = got.revision;
  std::set<std::string> placed;
  for (const auto& kv : got.kvs) placed.insert(kv.key.substr(r.key.size()));
  for (const auto& e : s.expected)
    if (!in.count(e) && placed.count(e)) out.push_back(e);
  return out;
}

int64_t EtcdRendezvous::stateRevision() {
  EtcdRange r;
  r.key = key("state");
  r.keys_only = true;
  auto got = etcd_->range(r);
  return got.kvs.empty() ? 0 : got.kvs.front().mod_revision;
}

std::optional<WorldAssignment> EtcdRendezvous::assigned(const RoundState& s, int64_t state_rev,
                                                        bool closed_here) {
  assigning_ = true;
  std::vector<int> local_world_sizes;
  for (const auto& n : s.nodes) local_world_sizes.push_back(n.nproc);
  rdzv::round_rules::RankLayout layout = rdzv::round_rules::rankLayout(local_world_sizes);
  rdzv::round_rules::NodePlace place;  // the same place the gRPC backend's client returns
  place.round = s.round;
  place.epoch_ms = s.epoch_ms;
  place.group_world_size = static_cast<int>(s.nodes.size());
  for (size_t i = 0; i < s.nodes.size(); ++i) {
    if (s.nodes[i].id == c_.node_id) {
      place.group_rank = static_cast<int>(i);
      place.rank_offset = static_cast<int>(layout.offsets[i]);
    }
  }
  place.world_size = static_cast<int>(layout.world_size);
  WorldAssignment w;
  static_cast<rdzv::round_rules::NodePlace&>(w) = place;
  w.run_id = c_.run_id;
  w.master_addr = s.nodes.front().addr;
  std::vector<std::string> members;
  for (const auto& n : s.nodes) members.push_back(n.id);
  {
    std::lock_guard<std::mutex> lock(mu_);
    current_ = w;
    members_ = members;
    state_rev_ = state_rev;
    left_ = false;
  }
  ended_since_.reset();
  // From the revision that completed the round: a member's place that vanished since then
  // ends the round on every node, whenever each read the state.
  startWatch(s.round, members, state_rev);
  // A place that vanished between the count and the round's completion (a lease expiring
  // touches no seq): the round cannot run; end it now. The closing node checks, once.
  if (closed_here) {
    EtcdRange r;
    r.key = joinsPrefix(s.round);
    r.range_end = etcdPrefixEnd(r.key);
    r.keys_only = true;
    std::set<std::string> alive;
    for (const auto& kv : etcd_->range(r).kvs) alive.insert(kv.key.substr(r.key.size()));
    for (const auto& m : members)
      if (!alive.count(m)) {
        std::string why =
            fmt::format("node {} lost: its etcd lease expired as round {} formed", m, s.round);
        invalidate(s.round, state_rev, members, m, why);
        roundEnded(s.round, why);
        break;
      }
  }
  roundAssigned(w.group_rank, w.group_world_size, w.round);
  w.restart_count = failureCount();
  // Workers bootstrap through a TCPStore that rank 0 hosts (MASTER_ADDR:MASTER_PORT, as
  // torchrun's static rendezvous): group rank 0 picks the port on its machine and tells the
  // others through etcd.
  std::string port_key = roundKey("master_port");
  if (w.group_rank == 0) {
    w.master_port = pickMasterPort(w.master_addr, c_.local_addr);
    etcd_->put(port_key, std::to_string(w.master_port));
  } else {
    auto v = waitForEtcdKey(etcd_.get(), port_key, c_.read_timeout);
    if (!v)
      throw TimeoutError(
          fmt::format("node 0 of round {} did not publish MASTER_PORT under '{}' "
                      "within {}",
                      s.round, port_key, seconds(c_.read_timeout)));
    w.master_port = parsePort("MASTER_PORT published by node 0 under '" + port_key + "'", *v);
  }
  log::info("round {}: node {}/{} ({} nodes, world size {}), ranks {}..{}{}", w.round, w.group_rank,
            w.group_world_size, w.group_world_size, w.world_size, w.rank_offset,
            w.rank_offset + c_.local_world_size - 1,
            s.reason.empty() ? "" : " (after: " + s.reason + ")");
  if (w.group_rank == 0) logPreflightTable();
  return w;
}

}  // namespace ddpl::launcher::etcd_detail
