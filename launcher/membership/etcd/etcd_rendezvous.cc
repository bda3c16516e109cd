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
#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>

#include "common/errors.h"
#include "common/log.h"
#include "common/parse.h"
#include "launcher/membership/multi_node_rendezvous.h"
#include "launcher/membership/ports.h"
#include "rendezvous/state/rendezvous_state.h"

namespace ddpl::launcher {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

struct NodeEntry {
  std::string id;
  int nproc = 1;
  std::string addr;
};

struct RoundState {
  int64_t round = 0;
  bool complete = false;
  std::vector<NodeEntry> nodes;       // the members of a complete round, by id; else empty
  std::vector<std::string> expected;  // survivors of the previous round, expected back
  std::string reason;                 // why the previous round ended
  int min_nodes = 1, max_nodes = 1;
  // A forming round's nodes that stopped before joining (node id -> why), until stopped_until
  // (unix seconds, the writer's clock: a join timeout after the last stop). As the gRPC
  // service's rounds (rendezvous_state.h): the round waits for no more nodes than can come,
  // and fails when min nodes cannot. Agents that predate it ignore the fields.
  std::map<std::string, std::string> stopped;
  double stopped_until = 0;

  bool has(const std::string& id) const {
    return std::any_of(nodes.begin(), nodes.end(), [&](const NodeEntry& n) { return n.id == id; });
  }

  std::string encode() const {
    json j;
    j["round"] = round;
    j["phase"] = complete ? "complete" : "joining";
    j["nodes"] = json::array();
    for (const auto& n : nodes)
      j["nodes"].push_back({{"id", n.id}, {"nproc", n.nproc}, {"addr", n.addr}});
    j["expected"] = expected;
    j["reason"] = reason;
    j["min"] = min_nodes;
    j["max"] = max_nodes;
    if (!stopped.empty()) {
      j["stopped"] = stopped;
      j["stopped_until"] = stopped_until;
    }
    return j.dump();
  }

  // The stops still in force at unix time `now`.
  std::map<std::string, std::string> stops(double now) const {
    return now < stopped_until ? stopped : std::map<std::string, std::string>{};
  }

  // The value comes from etcd, written by another agent (or anyone with access): parsed,
  // never trusted to be well-formed.
  static RoundState decode(const std::string& key, const std::string& v) {
    try {
      json j = json::parse(v);
      RoundState s;
      s.round = j.at("round").get<int64_t>();
      s.complete = j.at("phase").get<std::string>() == "complete";
      for (const auto& n : j.at("nodes"))
        s.nodes.push_back({n.at("id").get<std::string>(), n.at("nproc").get<int>(),
                           n.at("addr").get<std::string>()});
      s.expected = j.at("expected").get<std::vector<std::string>>();
      s.reason = j.at("reason").get<std::string>();
      s.min_nodes = j.at("min").get<int>();
      s.max_nodes = j.at("max").get<int>();
      if (j.contains("stopped")) {
        s.stopped = j.at("stopped").get<std::map<std::string, std::string>>();
        s.stopped_until = j.at("stopped_until").get<double>();
      }
      return s;
    } catch (const std::exception& e) {
      throw StoreError(
          fmt::format("etcd key '{}' does not hold a rendezvous round ({}): another "
                      "program uses this prefix?",
                      key, e.what()));
    }
  }
};

// A joiner's place: its nproc and address, written by itself.
std::string encodeJoin(const NodeEntry& n) {
  return json{{"nproc", n.nproc}, {"addr", n.addr}}.dump();
}

NodeEntry decodeJoin(const std::string& key, const std::string& id, const std::string& v) {
  try {
    json j = json::parse(v);
    return {id, j.at("nproc").get<int>(), j.at("addr").get<std::string>()};
  } catch (const std::exception& e) {
    throw StoreError(fmt::format("etcd key '{}' does not hold a node's place ({})", key, e.what()));
  }
}

std::string seconds(milliseconds d) { return fmt::format("{:.0f}s", d.count() / 1000.0); }

double unixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

bool isLoopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

// The job's health keys in etcd, under P.
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

// Threads, on top of multi_node_rendezvous.h's contract:
// - the joiner thread runs joinOnce(): etcd calls (each bounded by the call timeout) and
//   watches (one stream per wait, ended at once by join_cancel_ when the agent stops), up
//   to the join timeout; it alone touches
//   place_*, until `done` ran (the agent's loop then uses them in recordFailure()/finish());
// - the keep-alive thread renews the lease every TTL/3 and, when the lease expired anyway,
//   ends the round (RoundEnded runs there);
// - the round's watch thread (watch_) answers other nodes' pings and ends the round when the
//   state moves on or a member's place vanishes (RoundEnded runs there; it may write one
//   transaction first). watch_ is reset only from the agent's loop or the joiner, never from
//   its own callback;
// - mu_ guards what the three share (current_, members_, state_rev_, ended_round_, lease_).
// roundStillCurrent() waits for the other members' answers up to the lease TTL + 2 s;
// finish() up to the exit barrier timeout, then a few etcd calls.
class EtcdRendezvous : public MultiNodeRendezvous {
 public:
  explicit EtcdRendezvous(const EtcdRendezvousConfig& c)
      : MultiNodeRendezvous(c.rounds.node_id), c_(c.rounds), lease_ttl_(c.lease_ttl) {
    etcd_ = std::make_unique<EtcdClient>(c.etcd);
    std::string prefix = c.prefix;
    while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
    p_ = prefix + "/" + c_.run_id + "/";
    setKv(std::make_unique<EtcdJobKv>(etcd_.get(), p_));
    if (!c_.local_addr.empty()) {
      address_ = c_.local_addr;
    } else {
      HostPort hp = parseHostPort("etcd endpoint", c.etcd.endpoints.front(), 2379);
      address_ = routeAddressTo(hp.host, hp.port);
    }
    lease_ = etcd_->grantLease(lease_ttl_);
    keeper_ = etcd_->keepAlive(lease_, lease_ttl_, [this](int64_t id) { return leaseExpired(id); });
    log::info("rendezvous in etcd at {} under '{}', node '{}' at {}, {}:{} nodes, lease TTL {}s",
              etcd_->endpoints(), p_, c_.node_id, address_, c_.min_nodes, c_.max_nodes,
              lease_ttl_.count());
  }

  ~EtcdRendezvous() override {
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

  bool roundStillCurrent() override {
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
      int64_t rev =
          etcd_->put(fmt::format("{}round/{}/ping/{}", p_, cur->round, c_.node_id), probe);
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

  int recordFailure(const std::string& summary) override {
    std::string why;
    // Each call would wait out the call timeout for an etcd that is gone (as the probe of
    // roundStillCurrent() just before found); the agent gives up on the count at once instead
    // (and the job's outcome is this node's own failure).
    if (lost(&why)) throw NetworkError("etcd is lost: " + why);
    try {
      int n = static_cast<int>(etcd_->add(key("failures"), 1));
      etcd_->put(key("last_failure"), summary);
      if (current_) etcd_->put(roundKey("end"), "failed");
      leaveQuietly(fmt::format("node {}'s worker group failed", c_.node_id));
      return n;
    } catch (const std::exception& e) {
      noteTransport(e);
      throw;
    }
  }

  // As recordFailure does once the workers are stopped: the others re-form at once.
  void leaveEarly() override { leaveQuietly(fmt::format("node {} left", c_.node_id)); }

  std::string jobFailure() override {
    if (!cached_failure_.empty()) return cached_failure_;
    std::string why;
    if (lost(&why)) return "<could not read it: etcd is lost: " + why + ">";
    try {
      auto kv = etcd_->get(key("last_failure"));
      return kv ? kv->value : "";
    } catch (const std::exception& e) {
      noteTransport(e);
      return std::string("<could not read it: ") + e.what() + ">";
    }
  }

  bool finish(bool success) override {
    finishing_ = true;      // members leaving after the job is done end nothing; a join gives up
    join_cancel_.cancel();  // at once, if it is waiting
    stopHealth();           // nothing is published for a node on its way out
    waitForJoiner();        // place_ is the joiner's until then
    bool job_ok = true;
    if (success && current_ &&
        mayCall(Clock::time_point::max(), "waiting for the other nodes to finish")) {
      try {
        watchPingsOnly();
        // A key per node and a count, not a shared counter: N nodes finishing together would
        // otherwise retry their compare-and-swap against each other.
        if (countAfterPut(roundKey("done/")) >= current_->group_world_size)
          etcd_->put(roundKey("end"), "done");
        // Leaving ends the round for nodes still running, so wait for them: returns at once
        // when the last node is done or any node failed.
        auto end = waitForKey(roundKey("end"), c_.exit_barrier_timeout);
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
        if (countAfterPut(roundKey("gone/")) >= current_->group_world_size) {
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

  void stopBeforeJoining(const std::string& reason) override {
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

  std::string describe() const override { return "etcd at " + etcd_->endpoints() + " under " + p_; }

 private:
  std::string key(const std::string& k) const { return p_ + k; }
  std::string joinsPrefix(int64_t round) const { return fmt::format("{}joins/{}/", p_, round); }
  std::string joinKey(int64_t round, const std::string& node) const {
    return joinsPrefix(round) + node;
  }
  std::string seqKey(int64_t round) const { return fmt::format("{}seq/{}", p_, round); }
  std::string roundKey(const std::string& what) const {
    return fmt::format("{}round/{}/{}", p_, current_ ? current_->round : -1, what);
  }
  NodeEntry me() const { return {c_.node_id, c_.local_world_size, address_}; }
  int64_t lease() {
    std::lock_guard<std::mutex> lock(mu_);
    return lease_;
  }
  void checkStop() {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_ || finishing_) throw Error("the launcher is shutting down");
  }

  // Puts <prefix><this node> and returns how many keys the prefix then holds. Puts are
  // linearized: of nodes racing, the last to put counts them all.
  int64_t countAfterPut(const std::string& prefix) {
    etcd_->put(prefix + c_.node_id, "1");
    EtcdRange r;
    r.key = prefix;
    r.range_end = etcdPrefixEnd(prefix);
    r.count_only = true;
    return etcd_->range(r).count;
  }

  void checkConfig(const RoundState& s) const {
    if (s.min_nodes != c_.min_nodes || s.max_nodes != c_.max_nodes)
      throw InvalidArgument(fmt::format(
          "run '{}' in etcd is for {}:{} nodes but this node says --nnodes={}:{}: every node "
          "of a job must give the same --nnodes",
          c_.run_id, s.min_nodes, s.max_nodes, c_.min_nodes, c_.max_nodes));
  }

  // Takes a place in forming round `round` if the state is still the one read at `srev`
  // (0: there is none yet; then `open` is the state to create). Gives up the place held in
  // another round in the same transaction. False: the state moved on first.
  bool takePlace(int64_t round, int64_t srev, const RoundState* open = nullptr) {
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

  // Gives up the place held in a round that did not take this node (or that it leaves before
  // it forms); touches the round's seq so that a count taken before does not close the round.
  void givePlace() {
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

  // An etcd call that got no answer within the call timeout does not end the join: while
  // the join timeout allows, the joiner reads the state again and carries on, after a pause
  // drawn at random so that joiners do not come back together. 1024 agents starting at once
  // beside one etcd member on 2 cores had reads unanswered for 30 s, and every agent that
  // gave up made the whole job fail (issue 14). A round that formed is not retried here.
  std::optional<WorldAssignment> joinOnce() override {
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

  std::optional<WorldAssignment> joinUntil(Clock::time_point deadline, std::mt19937_64& rng) {
    // A node that stopped because another failed for good must not wait for a round that
    // will never form: the count tells, and the supervisor reports the failure.
    int failures = static_cast<int>(etcd_->add(key("failures"), 0));
    if (failures > c_.max_restarts) {
      WorldAssignment w;
      w.run_id = c_.run_id;
      w.restart_count = failures;
      return w;
    }
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
        takePlace(0, 0, &s);
        continue;
      }
      RoundState s = RoundState::decode(key("state"), kv->value);
      checkConfig(s);
      if (!s.complete) {
        // A node stopped before joining and min nodes can no longer come: fail now, not at
        // the join timeout (stopBeforeJoining() wrote the state, which wakes every wait here).
        std::string why = rdzv::cannotFormMessage(c_.run_id, s.round, s.min_nodes, s.max_nodes,
                                                  s.stops(unixNow()));
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
      EtcdRange oldest;
      oldest.key = joinsPrefix(s.round);
      oldest.range_end = etcdPrefixEnd(oldest.key);
      oldest.oldest_first = true;
      oldest.limit = 1;
      oldest.keys_only = true;
      auto first = etcd_->range(oldest);
      noteJoined(s.round, first.count);  // the whole range's, whatever the limit
      if (first.kvs.empty()) {  // even this node's place is gone (its lease expired): re-join
        place_round_ = -1;
        continue;
      }
      if (first.kvs.front().key == place_) {
        if (auto w = closeRound(s, srev, deadline)) return w;
        continue;
      }
      // This node's place may be gone already with its lease (expired while etcd was too
      // slow to renew it): then it takes a place again before it waits.
      EtcdRange mine;
      mine.key = place_;
      mine.keys_only = true;
      auto own = etcd_->range(mine);
      if (own.kvs.empty() || own.kvs.front().lease != place_lease_) {
        place_round_ = -1;
        continue;
      }
      // Woken when the state changes (the round completes), the counting node goes, or this
      // node's place does (the wait is not cut into slices that would notice it otherwise).
      waitOrTimeout(deadline, {{key("state"), ""}, {first.kvs.front().key, ""}, {place_, ""}}, rev,
                    s);
    }
  }

  // A complete round that this node saw end but whose state nobody moved on yet: the node that
  // ended it (a leaving node, or the first member to see a death) writes the next state in
  // one transaction. If the state does not move within a lease TTL, that node died in
  // between: end the round here. True: moved it on.
  bool waitedOnEnded(const RoundState& s) {
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

  // Waits for an event on `ranges` after `rev`, up to the join deadline (or `until`), or until
  // the agent stops;
  // throws at the deadline.
  void waitOrTimeout(Clock::time_point deadline,
                     const std::vector<std::pair<std::string, std::string>>& ranges, int64_t rev,
                     const RoundState& s, std::optional<Clock::time_point> until = std::nullopt) {
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

  // The most places seen at once in forming round `round`: nodes that time out together give
  // up their places one by one, and the last to go would otherwise report itself alone.
  void noteJoined(int64_t round, int64_t n) {
    if (round != seen_round_) {
      seen_round_ = round;
      seen_joined_ = 0;
    }
    seen_joined_ = std::max(seen_joined_, n);
  }

  [[noreturn]] void timedOut(const RoundState& s) {
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

  // Compare-and-swap conflicts are rare here (opening or ending a round), but when several
  // nodes do it at once, they should not retry in lockstep.
  void backoff(std::mt19937_64& rng) {
    std::this_thread::sleep_for(milliseconds(std::uniform_int_distribution<int>(1, 20)(rng)));
  }

  // The counting node of forming round `s`: follows the places taken (its first read lists
  // them, then only what changed since), and closes the round once the rules of
  // rendezvous_state.h say so: at once when max nodes are in, or every node expected back
  // (and min) is; otherwise when the last call ends. Returns the world once this node closed
  // the round; nothing when the state moved on (or the counting moved to another node).
  std::optional<WorldAssignment> closeRound(const RoundState& s, int64_t srev,
                                            Clock::time_point deadline) {
    const std::string prefix = joinsPrefix(s.round);
    std::map<std::string, EtcdKv> places;  // by key
    int64_t seen = 0;                      // the revision `places` is as of
    std::optional<Clock::time_point> last_call_at;
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
      // Nodes that stopped before joining will not come: no waiting for them.
      int can_come = c_.max_nodes - static_cast<int>(s.stops(unixNow()).size());
      bool now = n >= std::max(c_.min_nodes, can_come) ||
                 (!s.expected.empty() && n >= c_.min_nodes &&
                  std::all_of(s.expected.begin(), s.expected.end(),
                              [&](const std::string& e) { return in.count(e) > 0; }));
      if (n >= c_.min_nodes && !last_call_at) last_call_at = Clock::now() + c_.last_call_timeout;
      if (n < c_.min_nodes) last_call_at.reset();
      if (now || (last_call_at && Clock::now() >= *last_call_at)) {
        RoundState done = s;
        done.complete = true;
        done.stopped.clear();  // they concerned the forming round only
        done.stopped_until = 0;
        done.nodes.clear();
        for (const auto* kv : order)
          done.nodes.push_back(decodeJoin(kv->key, kv->key.substr(prefix.size()), kv->value));
        std::sort(done.nodes.begin(), done.nodes.end(),
                  [](const NodeEntry& a, const NodeEntry& b) { return a.id < b.id; });
        // Only if the state is the one read and no node took or gave up a place since the
        // count (a node's lease expiring is the one change that does not touch seq: see below).
        auto r = etcd_->txn({{key("state"), EtcdCompare::Target::kMod, srev},
                             {seqKey(s.round), EtcdCompare::Target::kMod, seen + 1, "",
                              EtcdCompare::Result::kLess}},
                            {{EtcdOp::Kind::kPut, key("state"), done.encode()}});
        if (r.succeeded) {
          log::debug("closed round {} with {} of {} node(s) that took a place", s.round, n,
                     places.size());
          return assigned(done, r.revision, true);
        }
        if (stateRevision() != srev) return std::nullopt;
        // Places changed since the count: catch up below, without waiting.
      } else {
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

  // The state's mod revision (0: none), without its value (a complete round's lists every node).
  int64_t stateRevision() {
    EtcdRange r;
    r.key = key("state");
    r.keys_only = true;
    auto got = etcd_->range(r);
    return got.kvs.empty() ? 0 : got.kvs.front().mod_revision;
  }

  // `closed_here`: this node's transaction completed the round.
  std::optional<WorldAssignment> assigned(const RoundState& s, int64_t state_rev,
                                          bool closed_here = false) {
    assigning_ = true;
    WorldAssignment w;
    w.run_id = c_.run_id;
    w.round = s.round;
    w.group_world_size = static_cast<int>(s.nodes.size());
    int offset = 0;
    for (size_t i = 0; i < s.nodes.size(); ++i) {
      if (s.nodes[i].id == c_.node_id) {
        w.group_rank = static_cast<int>(i);
        w.rank_offset = offset;
      }
      offset += s.nodes[i].nproc;
    }
    w.world_size = offset;
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
    w.restart_count = static_cast<int>(etcd_->add(key("failures"), 0));
    // Workers bootstrap through a TCPStore that rank 0 hosts (MASTER_ADDR:MASTER_PORT, as
    // torchrun's static rendezvous): group rank 0 picks the port on its machine and tells the
    // others through etcd.
    std::string port_key = roundKey("master_port");
    if (w.group_rank == 0) {
      std::string bind_addr = c_.local_addr.empty() ? "0.0.0.0" : c_.local_addr;
      w.master_port = pickFreePort(isLoopback(w.master_addr) ? "127.0.0.1" : bind_addr);
      etcd_->put(port_key, std::to_string(w.master_port));
    } else {
      auto v = waitForKey(port_key, c_.read_timeout);
      if (!v)
        throw TimeoutError(
            fmt::format("node 0 of round {} did not publish MASTER_PORT under '{}' "
                        "within {}",
                        s.round, port_key, seconds(c_.read_timeout)));
      w.master_port = parsePort("MASTER_PORT published by node 0 under '" + port_key + "'", *v);
    }
    log::info("round {}: node {}/{} ({} nodes, world size {}), ranks {}..{}{}", w.round,
              w.group_rank, w.group_world_size, w.group_world_size, w.world_size, w.rank_offset,
              w.rank_offset + c_.local_world_size - 1,
              s.reason.empty() ? "" : " (after: " + s.reason + ")");
    if (w.group_rank == 0) logPreflightTable();
    return w;
  }

  // Returns the key's value once it exists, or nothing after `timeout`.
  std::optional<std::string> waitForKey(const std::string& k, milliseconds timeout) {
    auto deadline = Clock::now() + timeout;
    while (true) {
      int64_t rev = 0;
      auto kv = etcd_->get(k, &rev);
      if (kv) return kv->value;
      auto now = Clock::now();
      if (now >= deadline) return std::nullopt;
      etcd_->waitForEvent(
          k, "", rev + 1,
          std::chrono::duration_cast<milliseconds>(deadline - now) + milliseconds(1));
    }
  }

  void beforeJoin() override { watch_.reset(); }

  // The round's end, pushed by etcd: the state moving on (a node left, failed or wants in) or
  // a member's place vanishing with its lease (the node stopped keeping it alive). Watches
  // only the keys that can end the round, and the pings to answer.
  void startWatch(int64_t round, const std::vector<std::string>& members, int64_t rev) {
    std::string state_key = key("state"), places = joinsPrefix(round);
    std::string ping_prefix = fmt::format("{}round/{}/ping/", p_, round);
    std::set<std::string> member_set(members.begin(), members.end());
    watch_ = etcd_->watch(
        {{state_key, ""},
         {places, etcdPrefixEnd(places)},
         {ping_prefix, etcdPrefixEnd(ping_prefix)}},
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
                roundEnded(round,
                           s.reason.empty() ? fmt::format("round {} ended", round) : s.reason);
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

  // Another member asks whether this node is alive: answering is the proof. False: `ev` is
  // no ping.
  bool answerPing(int64_t round, const std::string& ping_prefix, const EtcdEvent& ev) {
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

  // Through the exit barrier a node only answers pings: the round's end no longer matters to
  // it, and watching the places would bring it every other node's leaving (N^2 events per
  // job). The new watch starts before the old one stops, from the round's start: a ping is
  // never missed, and one answered twice does no harm.
  void watchPingsOnly() {
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

  // Ends complete round `round`, if its state is still the one written at `srev`: the next
  // round expects its members back, less `lost`. False: another node moved it on first.
  bool invalidate(int64_t round, int64_t srev, const std::vector<std::string>& members,
                  const std::string& lost, const std::string& why) {
    RoundState next;
    next.round = round + 1;
    next.min_nodes = c_.min_nodes;
    next.max_nodes = c_.max_nodes;
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

  void roundEnded(int64_t round, const std::string& why) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (ended_round_ >= round) return;
      ended_round_ = round;
    }
    cv_.notify_all();
    endRound(round, why);
  }

  void leaveQuietly(const std::string& why) {
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

  // A call failed on the transport (no endpoint answered within the call timeout): etcd
  // counts as lost from now on (MultiNodeRendezvous::markLost).
  void noteTransport(const std::exception& e) {
    if (dynamic_cast<const NetworkError*>(&e)) markLost(e.what());
  }

  void revokeLease() {
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

  // Replaces lease `expired` with a fresh one, once, whichever thread finds it gone first (the
  // keep-alive thread, or the joiner whose transaction etcd refused for it).
  int64_t renewLease(int64_t expired) {
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

  // etcd says this node's lease no longer exists (the agent was stopped, or etcd unreachable,
  // for its TTL): the others dropped this node, so the round is over for it, and a fresh lease
  // carries it into the next. On the keeper's thread, which then keeps the fresh lease it
  // returns.
  int64_t leaseExpired(int64_t id) {
    log::warn("this node's etcd lease {:x} expired: the other nodes dropped it", id);
    std::optional<int64_t> round;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (current_) round = current_->round;
    }
    if (round && !finishing_)
      roundEnded(*round,
                 "this node's etcd lease expired (no keep-alive got through within its TTL)");
    return renewLease(id);
  }

  ElasticConfig c_;
  std::chrono::seconds lease_ttl_;
  std::unique_ptr<EtcdClient> etcd_;
  std::string p_, address_;
  // Keeps lease_ alive (one stream); reset before etcd_ goes, and before the lease is revoked.
  std::unique_ptr<EtcdLeaseKeeper> keeper_;
  EtcdCancel join_cancel_;  // ends the joiner's waits when the agent stops
  std::unique_ptr<EtcdWatch> watch_;
  // The joiner thread's own (then the agent's loop's, once the round formed: never both).
  std::string place_;         // this node's place key, "" when none
  int64_t place_round_ = -1;  // the round of place_
  int64_t place_lease_ = 0;   // the lease place_ was written with
  std::optional<Clock::time_point> ended_since_;
  int64_t seen_round_ = -1, seen_joined_ = 0;  // noteJoined
  bool assigning_ = false;  // the round formed: what fails now is no longer retried
  std::mutex renew_mu_;     // one lease renewal at a time
  std::mutex mu_;           // guards what follows
  std::condition_variable cv_;
  bool stop_ = false;
  int64_t lease_ = 0;
  std::optional<WorldAssignment> current_;
  std::vector<std::string> members_;  // node ids of the current round
  int64_t state_rev_ = 0;             // the mod revision of the current round's complete state
  int64_t ended_round_ = -1;
  bool left_ = false;
  std::atomic<bool> finishing_{false}, job_done_{false};
  std::string cached_failure_;
  // finish(): when the calls on the way out give up (none before: max).
  Clock::time_point close_by_ = Clock::time_point::max();
};

}  // namespace

std::unique_ptr<RendezvousHandler> makeEtcdRendezvous(const EtcdRendezvousConfig& config) {
  return std::make_unique<EtcdRendezvous>(config);
}

}  // namespace ddpl::launcher
