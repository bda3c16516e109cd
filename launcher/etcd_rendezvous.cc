// The etcd rendezvous: the rounds of rendezvous/rendezvous_state.h, kept in etcd instead of in
// one process. No node hosts anything; every agent reads the round's state, changes it with a
// compare-and-swap transaction on its mod revision (so of two agents racing, exactly one
// wins and the other reads again), and learns of changes through a watch.
//
// Keys, under P = <prefix>/<run_id>/:
//   P state                   the round: number, phase (joining/complete), nodes (sorted by
//                             node id: group ranks), nodes expected back, why the last ended
//   P members/<round>/<node>  one per node of a round, attached to the node's lease: it
//                             vanishes when the node's keep-alives stop for the lease's TTL
//                             (SIGKILL, power loss) or at once when the node revokes it
//   P failures, last_failure  the job-wide restart count and the last root cause
//   P round/<n>/...           master_port (published by group rank 0), the exit barrier's
//                             done/end, gone (the last node gone deletes all of P), and
//                             ping/<node>, pong/<node>/<peer>: a node whose workers failed
//                             asks the others to prove they are alive (roundStillCurrent)
//   P status/, stacks/        the job's health across nodes (launch status, launch stacks)
#include "launcher/etcd_rendezvous.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <map>
#include <set>
#include <tuple>
#include <thread>

#include "common/errors.h"
#include "common/log.h"
#include "common/parse.h"
#include "launcher/ports.h"

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
  std::vector<NodeEntry> nodes;       // joiners, or the members of a complete round; by id
  std::vector<std::string> expected;  // survivors of the previous round, expected back
  std::string reason;                 // why the previous round ended
  int min_nodes = 1, max_nodes = 1;

  bool has(const std::string& id) const {
    return std::any_of(nodes.begin(), nodes.end(), [&](const NodeEntry& n) { return n.id == id; });
  }
  void add(NodeEntry n) {
    nodes.push_back(std::move(n));
    std::sort(nodes.begin(), nodes.end(),
              [](const NodeEntry& a, const NodeEntry& b) { return a.id < b.id; });
  }
  void remove(const std::string& id) {
    nodes.erase(std::remove_if(nodes.begin(), nodes.end(),
                               [&](const NodeEntry& n) { return n.id == id; }),
                nodes.end());
  }
  // The rules of rendezvous_state.h: at once when max nodes are in, or when every node
  // expected back (and min) is; otherwise after the last call.
  bool completesNow() const {
    if (static_cast<int>(nodes.size()) >= max_nodes) return true;
    if (expected.empty() || static_cast<int>(nodes.size()) < min_nodes) return false;
    return std::all_of(expected.begin(), expected.end(), [&](const std::string& e) { return has(e); });
  }

  std::string encode() const {
    json j;
    j["round"] = round;
    j["phase"] = complete ? "complete" : "joining";
    j["nodes"] = json::array();
    for (const auto& n : nodes) j["nodes"].push_back({{"id", n.id}, {"nproc", n.nproc}, {"addr", n.addr}});
    j["expected"] = expected;
    j["reason"] = reason;
    j["min"] = min_nodes;
    j["max"] = max_nodes;
    return j.dump();
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
      return s;
    } catch (const std::exception& e) {
      throw StoreError(fmt::format("etcd key '{}' does not hold a rendezvous round ({}): another "
                                   "program uses this prefix?",
                                   key, e.what()));
    }
  }
};

// The health thread publishes this node's status this often (a node summary, not a message
// per step).
constexpr milliseconds kStatusEvery{std::chrono::seconds(5)};

constexpr milliseconds kJoinWaitSlice{std::chrono::seconds(5)};

double unixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string seconds(milliseconds d) { return fmt::format("{:.0f}s", d.count() / 1000.0); }

bool isLoopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

class EtcdRendezvous : public RendezvousHandler {
 public:
  explicit EtcdRendezvous(const EtcdRendezvousConfig& c)
      : c_(c.rounds), lease_ttl_(c.lease_ttl) {
    etcd_ = std::make_unique<EtcdClient>(c.etcd);
    std::string prefix = c.prefix;
    while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
    p_ = prefix + "/" + c_.run_id + "/";
    if (!c_.local_addr.empty()) {
      address_ = c_.local_addr;
    } else {
      HostPort hp = parseHostPort("etcd endpoint", c.etcd.endpoints.front(), 2379);
      address_ = routeAddressTo(hp.host, hp.port);
    }
    lease_ = etcd_->grantLease(lease_ttl_);
    keeper_ = std::thread([this] { keepAliveLoop(); });
    log::info("rendezvous in etcd at {} under '{}', node '{}' at {}, {}:{} nodes, lease TTL {}s",
              etcd_->endpoints(), p_, c_.node_id, address_, c_.min_nodes, c_.max_nodes,
              lease_ttl_.count());
  }

  ~EtcdRendezvous() override {
    stopHealth();
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (joiner_.joinable()) joiner_.join();
    watch_.reset();
    if (keeper_.joinable()) keeper_.join();
  }

  void setRoundEndedCallback(RoundEnded ended) override { ended_ = std::move(ended); }

  void startRendezvous(Done done) override {
    if (joiner_.joinable()) joiner_.join();
    watch_.reset();
    // Joining blocks until the round completes (up to the join timeout): a thread of its
    // own, so the agent keeps handling signals meanwhile.
    joiner_ = std::thread([this, done = std::move(done)] {
      try {
        done(joinOnce(), "");
      } catch (const std::exception& e) {
        done(std::nullopt, e.what());
      }
    });
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
        etcd_->waitForEvent(answers, etcdPrefixEnd(answers), rev + 1,
                            std::min(milliseconds(500), std::chrono::duration_cast<milliseconds>(deadline - now)));
      }
      auto kv = etcd_->get(key("state"));
      if (!kv) return false;
      RoundState s = RoundState::decode(key("state"), kv->value);
      return s.round == cur->round && s.complete && s.has(c_.node_id);
    } catch (const std::exception& e) {
      log::debug("cannot tell whether round {} is current ({}): counting the failure", cur->round,
                 e.what());
      return true;
    }
  }

  int recordFailure(const std::string& summary) override {
    int n = static_cast<int>(etcd_->add(key("failures"), 1));
    etcd_->put(key("last_failure"), summary);
    if (current_) etcd_->put(roundKey("end"), "failed");
    leaveQuietly(fmt::format("node {}'s worker group failed", c_.node_id));
    return n;
  }

  std::string jobFailure() override {
    if (!cached_failure_.empty()) return cached_failure_;
    try {
      auto kv = etcd_->get(key("last_failure"));
      return kv ? kv->value : "";
    } catch (const std::exception& e) {
      return std::string("<could not read it: ") + e.what() + ">";
    }
  }

  bool finish(bool success) override {
    finishing_ = true;  // members leaving after the job is done end nothing
    stopHealth();  // nothing is published for a node on its way out
    bool job_ok = true;
    if (success && current_) {
      try {
        int64_t done = etcd_->add(roundKey("done"), 1);
        if (done >= current_->group_world_size) etcd_->put(roundKey("end"), "done");
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
        log::warn("exit barrier: {}", e.what());
      }
    }
    // Kept through the barrier to answer other nodes' probes (roundStillCurrent): a node done
    // here is alive, whatever its workers' state.
    watch_.reset();
    leaveQuietly(fmt::format("node {} left", c_.node_id));
    if (current_) {
      try {
        cached_failure_ = jobFailure();  // read before the last node clears it
        int64_t gone = etcd_->add(roundKey("gone"), 1);
        if (gone >= current_->group_world_size) {
          // Every node of the job's last round is done with it: its keys must not outlive it
          // (a job re-run under the same id would start "already failed"). A node SIGKILLed
          // never gets here; its leased keys go with its lease, the rest stays.
          int64_t n = etcd_->deletePrefix(p_);
          log::debug("the job's last node out: deleted its {} key(s) under '{}'", n, p_);
        }
      } catch (const std::exception& e) {
        log::warn("closing the rendezvous: {}", e.what());
      }
    }
    revokeLease();
    return job_ok;
  }

  std::string describe() const override { return "etcd at " + etcd_->endpoints() + " under " + p_; }

  // ---- Job health across nodes, as the gRPC backend keeps it, under P status/ and stacks/.

  void publishStatus(const std::string& line) override {
    std::lock_guard<std::mutex> lock(health_mu_);
    status_ = line;
  }

  std::vector<std::string> otherNodesStatus() override {
    auto [me, nodes, round] = position();
    std::vector<std::string> out;
    std::map<int, std::string> by_rank;
    try {
      for (const auto& kv : etcd_->getPrefix(key("status/")))
        by_rank[std::atoi(kv.key.substr(key("status/").size()).c_str())] = kv.value;
    } catch (const std::exception& e) {
      return {fmt::format("cannot read the other nodes' status from etcd: {}", e.what())};
    }
    for (int r = 0; r < nodes; ++r) {
      if (r == me) continue;
      auto it = by_rank.find(r);
      // "<round>\n<host>\n<unix time>\n<line>"
      const std::string v = it == by_rank.end() ? "" : it->second;
      auto a = v.find('\n'), b = v.find('\n', a + 1), c = v.find('\n', b + 1);
      if (c == std::string::npos || v.substr(0, a) != std::to_string(round)) {
        out.push_back(fmt::format("node {}: no status published in round {} yet", r, round));
        continue;
      }
      double age = unixSeconds() - std::strtod(v.substr(b + 1, c - b - 1).c_str(), nullptr);
      out.push_back(fmt::format("node {} ({}): {} ({:.0f}s ago)", r, v.substr(a + 1, b - a - 1),
                                v.substr(c + 1), std::max(0.0, age)));
    }
    return out;
  }

  void setStacksRequestedCallback(StacksRequested requested) override {
    std::lock_guard<std::mutex> lock(health_mu_);
    stacks_requested_ = std::move(requested);
  }

  int64_t requestStacks(const std::string& why) override {
    auto [me, nodes, round] = position();
    if (nodes <= 1) return 0;
    try {
      int64_t id = etcd_->add(key("stacks/next"), 1);
      {
        std::lock_guard<std::mutex> lock(health_mu_);
        mine_.insert(id);
      }
      etcd_->put(fmt::format("{}stacks/{}", p_, id), why);
      return id;
    } catch (const std::exception& e) {
      log::warn("cannot ask the other nodes for their stacks: {}", e.what());
      return 0;
    }
  }

  void answerStacks(int64_t id, const std::string& answer) override {
    auto [me, nodes, round] = position();
    try {
      etcd_->put(fmt::format("{}stacks/{}/{}", p_, id, me), answer);
    } catch (const std::exception& e) {
      log::warn("cannot answer request {} for stacks: {}", id, e.what());
    }
  }

  StacksAnswers stacksAnswers(int64_t id) override {
    auto [me, nodes, round] = position();
    StacksAnswers out;
    if (id <= 0) return out;
    std::map<int, std::string> answers;
    std::string prefix = fmt::format("{}stacks/{}/", p_, id);
    try {
      for (const auto& kv : etcd_->getPrefix(prefix))
        answers[std::atoi(kv.key.substr(prefix.size()).c_str())] = kv.value;
    } catch (const std::exception& e) {
      log::debug("stacks of request {}: {}", id, e.what());
    }
    for (int r = 0; r < nodes; ++r) {
      if (r == me) continue;
      if (auto it = answers.find(r); it != answers.end()) out.answers.push_back(it->second);
      else out.missing.push_back(r);
    }
    return out;
  }

 private:
  std::string key(const std::string& k) const { return p_ + k; }
  std::string memberKey(int64_t round, const std::string& node) const {
    return fmt::format("{}members/{}/{}", p_, round, node);
  }
  std::string roundKey(const std::string& what) const {
    return fmt::format("{}round/{}/{}", p_, current_ ? current_->round : -1, what);
  }
  NodeEntry me() const { return {c_.node_id, c_.local_world_size, address_}; }
  int64_t lease() {
    std::lock_guard<std::mutex> lock(mu_);
    return lease_;
  }

  // Puts the state if it is unchanged since `rev` (0: if it does not exist), with `extra`
  // operations in the same transaction. False: another agent changed it first.
  bool casState(int64_t rev, const RoundState& s, std::vector<EtcdOp> extra = {}) {
    std::vector<EtcdOp> ops = {{EtcdOp::Kind::kPut, key("state"), s.encode()}};
    ops.insert(ops.end(), extra.begin(), extra.end());
    return etcd_->txn({{key("state"), EtcdCompare::Target::kMod, rev}}, ops).succeeded;
  }

  // My membership key of `round` (on my lease), and the removal of the one of the round before.
  std::vector<EtcdOp> joinOps(int64_t round) {
    std::vector<EtcdOp> ops = {{EtcdOp::Kind::kPut, memberKey(round, c_.node_id), "", lease()}};
    if (round > 0) ops.push_back({EtcdOp::Kind::kDelete, memberKey(round - 1, c_.node_id)});
    return ops;
  }

  void checkConfig(const RoundState& s) const {
    if (s.min_nodes != c_.min_nodes || s.max_nodes != c_.max_nodes)
      throw InvalidArgument(fmt::format(
          "run '{}' in etcd is for {}:{} nodes but this node says --nnodes={}:{}: every node "
          "of a job must give the same --nnodes",
          c_.run_id, s.min_nodes, s.max_nodes, c_.min_nodes, c_.max_nodes));
  }

  std::optional<WorldAssignment> joinOnce() {
    // A node that stopped because another failed for good must not wait for a round that
    // will never form: the count tells, and the supervisor reports the failure.
    int failures = static_cast<int>(etcd_->add(key("failures"), 0));
    if (failures > c_.max_restarts) {
      WorldAssignment w;
      w.run_id = c_.run_id;
      w.restart_count = failures;
      return w;
    }
    auto start = Clock::now();
    auto deadline = start + c_.join_timeout;
    int64_t last_call_round = -1;
    Clock::time_point last_call_at{};
    bool told_full = false;
    while (true) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stop_) throw Error("the launcher is shutting down");
      }
      int64_t rev = 0;
      auto kv = etcd_->get(key("state"), &rev);
      if (!kv) {
        // The first node of the run opens round 0.
        RoundState s;
        s.min_nodes = c_.min_nodes;
        s.max_nodes = c_.max_nodes;
        s.add(me());
        casState(0, s, joinOps(0));
        continue;
      }
      RoundState s = RoundState::decode(key("state"), kv->value);
      checkConfig(s);
      const int64_t srev = kv->mod_revision;
      if (s.complete && s.has(c_.node_id)) return assigned(s, rev);
      if (!s.complete) {
        // Joiners whose lease expired (SIGKILLed while waiting) are dropped, so that they
        // hold no place and the round does not wait for them.
        std::set<std::string> alive;
        for (const auto& m : etcd_->getPrefix(fmt::format("{}members/{}/", p_, s.round)))
          alive.insert(m.key.substr(m.key.rfind('/') + 1));
        RoundState next = s;
        for (const auto& n : s.nodes)
          if (!alive.count(n.id) && n.id != c_.node_id) next.remove(n.id);
        bool in = s.has(c_.node_id);
        if (!in && static_cast<int>(next.nodes.size()) < c_.max_nodes) {
          next.add(me());
          if (next.completesNow()) next.complete = true;
          casState(srev, next, joinOps(next.round));
          continue;
        }
        if (in) {
          std::vector<EtcdOp> extra;
          if (!alive.count(c_.node_id)) extra = joinOps(s.round);  // my key went with an old lease
          if (last_call_round != s.round && static_cast<int>(next.nodes.size()) >= c_.min_nodes) {
            last_call_round = s.round;
            last_call_at = Clock::now() + c_.last_call_timeout;
          }
          if (static_cast<int>(next.nodes.size()) < c_.min_nodes) last_call_round = -1;
          bool last_call_over = last_call_round == s.round && Clock::now() >= last_call_at;
          if (next.completesNow() || last_call_over) next.complete = true;
          if (next.complete || next.nodes.size() != s.nodes.size() || !extra.empty()) {
            casState(srev, next, extra);
            continue;
          }
        }
      } else if (static_cast<int>(s.nodes.size()) < c_.max_nodes) {
        // A complete round with room: end it, so that everyone re-joins with this node.
        RoundState next;
        next.round = s.round + 1;
        next.min_nodes = c_.min_nodes;
        next.max_nodes = c_.max_nodes;
        for (const auto& n : s.nodes) next.expected.push_back(n.id);
        next.reason = fmt::format("node {} wants to join (round {} has {}/{} nodes)", c_.node_id,
                                  s.round, s.nodes.size(), s.max_nodes);
        next.add(me());
        casState(srev, next, joinOps(next.round));
        continue;
      } else if (!told_full) {
        told_full = true;
        log::info("round {} is full ({} nodes): waiting for the next one", s.round, s.nodes.size());
      }
      auto now = Clock::now();
      if (now >= deadline) {
        leaveJoining();
        throw TimeoutError(fmt::format(
            "timed out after {} waiting for round {} of run '{}' to form in etcd: {}/{} nodes "
            "joined (--nnodes={}:{})",
            seconds(c_.join_timeout), s.round, c_.run_id, s.nodes.size(), c_.min_nodes,
            c_.min_nodes, c_.max_nodes));
      }
      auto until = deadline;
      if (last_call_round == s.round) until = std::min(until, last_call_at);
      // In slices, so that a launcher shutting down is not held for the join timeout.
      auto wait = std::min(std::chrono::duration_cast<milliseconds>(until - now) + milliseconds(1),
                           kJoinWaitSlice);
      etcd_->waitForEvent(p_, etcdPrefixEnd(p_), rev + 1, wait);
    }
  }

  // Gives up a place in a forming round (join timeout, or leaving before it completed).
  void leaveJoining() {
    try {
      for (int i = 0; i < 100; ++i) {
        auto kv = etcd_->get(key("state"));
        if (!kv) return;
        RoundState s = RoundState::decode(key("state"), kv->value);
        if (s.complete || !s.has(c_.node_id)) return;
        s.remove(c_.node_id);
        if (casState(kv->mod_revision, s, {{EtcdOp::Kind::kDelete, memberKey(s.round, c_.node_id)}}))
          return;
      }
    } catch (const std::exception& e) {
      log::warn("leaving the forming round: {}", e.what());
    }
  }

  std::optional<WorldAssignment> assigned(const RoundState& s, int64_t rev) {
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
    {
      std::lock_guard<std::mutex> lock(mu_);
      current_ = w;
      left_ = false;
    }
    startWatch(s, rev);
    startHealth();
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
        throw TimeoutError(fmt::format("node 0 of round {} did not publish MASTER_PORT under '{}' "
                                       "within {}",
                                       s.round, port_key, seconds(c_.read_timeout)));
      w.master_port = parsePort("MASTER_PORT published by node 0 under '" + port_key + "'", *v);
    }
    log::info("round {}: node {}/{} ({} nodes, world size {}), ranks {}..{}{}", w.round,
              w.group_rank, w.group_world_size, w.group_world_size, w.world_size, w.rank_offset,
              w.rank_offset + c_.local_world_size - 1,
              s.reason.empty() ? "" : " (after: " + s.reason + ")");
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
      etcd_->waitForEvent(k, "", rev + 1,
                          std::chrono::duration_cast<milliseconds>(deadline - now) + milliseconds(1));
    }
  }

  // The round's end, pushed by etcd: the state moving on (a node left, failed or wants in) or
  // a member's key vanishing with its lease (the node stopped keeping it alive).
  void startWatch(const RoundState& s, int64_t rev) {
    int64_t round = s.round;
    std::vector<std::string> members;
    for (const auto& n : s.nodes) members.push_back(n.id);
    std::string state_key = key("state"), members_prefix = fmt::format("{}members/{}/", p_, round);
    std::string ping_prefix = fmt::format("{}round/{}/ping/", p_, round);
    {
      std::lock_guard<std::mutex> lock(mu_);
      members_ = members;
    }
    watch_ = etcd_->watch(
        p_, etcdPrefixEnd(p_), rev + 1,
        [this, round, members, state_key, members_prefix, ping_prefix](const std::vector<EtcdEvent>& events) {
          for (const auto& ev : events) {
            // Another member asks whether this node is alive: answering is the proof.
            if (ev.type == EtcdEvent::Type::kPut && ev.kv.key.rfind(ping_prefix, 0) == 0) {
              std::string asker = ev.kv.key.substr(ping_prefix.size());
              if (asker == c_.node_id) continue;
              try {
                etcd_->put(fmt::format("{}round/{}/pong/{}/{}", p_, round, asker, c_.node_id),
                           ev.kv.value);
              } catch (const std::exception& e) {
                log::warn("answering node {}'s liveness probe: {}", asker, e.what());
              }
              continue;
            }
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
            } else if (ev.type == EtcdEvent::Type::kDelete &&
                       ev.kv.key.rfind(members_prefix, 0) == 0) {
              std::string node = ev.kv.key.substr(members_prefix.size());
              if (node == c_.node_id) {
                roundEnded(round, "this node's etcd lease expired (no keep-alive got through "
                                  "within its TTL)");
                return;
              }
              std::string why = fmt::format(
                  "node {} lost: its etcd lease expired (no keep-alive for {}s)", node,
                  lease_ttl_.count());
              invalidate(round, members, node, why);
              roundEnded(round, why);
              return;
            }
          }
        },
        [this, round](const std::string& why) { roundEnded(round, "lost etcd: " + why); });
  }

  // Ends complete round `round` (if it still is the current one): the next round expects
  // its members back, less `lost`.
  void invalidate(int64_t round, const std::vector<std::string>& members, const std::string& lost,
                  const std::string& why) {
    try {
      for (int i = 0; i < 100; ++i) {
        auto kv = etcd_->get(key("state"));
        if (!kv) return;
        RoundState s = RoundState::decode(key("state"), kv->value);
        if (s.round != round || !s.complete) return;  // someone else did it
        RoundState next;
        next.round = round + 1;
        next.min_nodes = s.min_nodes;
        next.max_nodes = s.max_nodes;
        for (const auto& m : members)
          if (m != lost) next.expected.push_back(m);
        next.reason = why;
        if (casState(kv->mod_revision, next)) return;
      }
    } catch (const std::exception& e) {
      log::warn("ending round {} in etcd: {}", round, e.what());
    }
  }

  void roundEnded(int64_t round, const std::string& why) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (ended_round_ >= round) return;
      ended_round_ = round;
    }
    cv_.notify_all();
    if (ended_) ended_(round, why);
  }

  void leaveQuietly(const std::string& why) {
    std::optional<WorldAssignment> cur;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (left_ || !current_) return;
      left_ = true;
      cur = current_;
    }
    watch_.reset();
    if (!job_done_) {
      // The others re-form at once instead of waiting out this node's lease.
      auto kv = etcd_->get(key("state"));
      if (kv) {
        RoundState s = RoundState::decode(key("state"), kv->value);
        std::vector<std::string> members;
        for (const auto& n : s.nodes) members.push_back(n.id);
        if (s.round == cur->round && s.complete) invalidate(cur->round, members, c_.node_id, why);
      }
    }
    try {
      etcd_->txn({}, {{EtcdOp::Kind::kDelete, memberKey(cur->round, c_.node_id)}});
    } catch (const std::exception& e) {
      log::warn("leaving the rendezvous: {}", e.what());
    }
  }

  void revokeLease() {
    int64_t id;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      id = lease_;
    }
    cv_.notify_all();
    if (keeper_.joinable()) keeper_.join();
    try {
      etcd_->revokeLease(id);
    } catch (const std::exception& e) {
      log::warn("revoking this node's etcd lease: {} (it expires within {}s)", e.what(),
                lease_ttl_.count());
    }
  }

  // Keeps this node's lease alive, three times per TTL so that one lost keep-alive (an etcd
  // member dying, an election) is not fatal. A lease that expired anyway (the agent was
  // stopped, or etcd unreachable for the TTL) means the others dropped this node: the round is
  // over for it, and a fresh lease carries it into the next.
  void keepAliveLoop() {
    auto every = std::chrono::duration_cast<milliseconds>(lease_ttl_) / 3;
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      if (cv_.wait_for(lock, every, [this] { return stop_; })) return;
      int64_t id = lease_;
      lock.unlock();
      try {
        if (etcd_->keepAliveOnce(id) <= 0) {
          log::warn("this node's etcd lease {:x} expired: the other nodes dropped it", id);
          int64_t fresh = etcd_->grantLease(lease_ttl_);
          std::optional<int64_t> round;
          {
            std::lock_guard<std::mutex> l(mu_);
            lease_ = fresh;
            if (current_) round = current_->round;
          }
          if (round && !finishing_)
            roundEnded(*round, "this node's etcd lease expired (no keep-alive got through within "
                               "its TTL)");
        }
      } catch (const std::exception& e) {
        log::warn("etcd keep-alive: {}", e.what());
      }
      lock.lock();
    }
  }

  // This node's group rank, the round's number of nodes and the round; (-1, 0, -1) before
  // the first round.
  std::tuple<int, int, int64_t> position() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!current_) return {-1, 0, -1};
    return {current_->group_rank, current_->group_world_size, current_->round};
  }

  void startHealth() {
    std::lock_guard<std::mutex> lock(health_mu_);
    if (health_.joinable()) return;
    health_ = std::thread([this] { healthLoop(); });
  }

  void stopHealth() {
    {
      std::lock_guard<std::mutex> lock(health_mu_);
      health_stop_ = true;
    }
    health_cv_.notify_all();
    if (health_.joinable()) health_.join();
    stacks_watch_.reset();
  }

  // Publishes this node's status every few seconds and hands other nodes' requests for stacks
  // to the agent as soon as etcd pushes them (a watch on stacks/, not a poll). Errors (etcd
  // electing a leader) are retried on the next turn: health is best effort, never fatal.
  void healthLoop() {
    int64_t next = -1;  // the next request id to look for
    auto published = Clock::time_point{};
    std::unique_lock<std::mutex> lock(health_mu_);
    while (!health_stop_) {
      std::string line = status_;
      StacksRequested requested = stacks_requested_;
      stacks_poked_ = false;
      lock.unlock();
      bool more = false;
      try {
        if (next < 0) {
          int64_t rev = 0;
          auto kv = etcd_->get(key("stacks/next"), &rev);
          next = (kv ? std::atoll(kv->value.c_str()) : 0) + 1;  // earlier requests are over
          stacks_watch_ = etcd_->watch(
              key("stacks/"), etcdPrefixEnd(key("stacks/")), rev + 1,
              [this](const std::vector<EtcdEvent>&) {
                std::lock_guard<std::mutex> l(health_mu_);
                stacks_poked_ = true;
                health_cv_.notify_all();
              },
              [](const std::string& why) { log::debug("job health: {}", why); });
        }
        auto [me, nodes, round] = position();
        auto now = Clock::now();
        if (!line.empty() && me >= 0 && now - published >= kStatusEvery) {
          etcd_->put(fmt::format("{}status/{}", p_, me),
                     fmt::format("{}\n{}\n{:.3f}\n{}", round, log::hostname(), unixSeconds(), line));
          published = now;
        }
        if (auto kv = etcd_->get(fmt::format("{}stacks/{}", p_, next))) {
          bool own;
          {
            std::lock_guard<std::mutex> l(health_mu_);
            own = mine_.count(next) > 0;
          }
          if (!own && requested) requested(next, kv->value);
          ++next;
          more = true;  // another may follow at once
        }
      } catch (const std::exception& e) {
        log::debug("job health: {}", e.what());
      }
      lock.lock();
      if (!more)
        health_cv_.wait_for(lock, kStatusEvery, [this] { return health_stop_ || stacks_poked_; });
    }
  }

  ElasticConfig c_;
  std::chrono::seconds lease_ttl_;
  std::unique_ptr<EtcdClient> etcd_;
  std::string p_, address_;
  std::thread joiner_, keeper_;
  std::unique_ptr<EtcdWatch> watch_;
  RoundEnded ended_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  int64_t lease_ = 0;
  std::optional<WorldAssignment> current_;
  std::vector<std::string> members_;  // node ids of the current round
  int64_t ended_round_ = -1;
  bool left_ = false;
  std::atomic<bool> finishing_{false}, job_done_{false};
  std::string cached_failure_;
  std::mutex health_mu_;  // guards the health thread's state below
  std::condition_variable health_cv_;
  std::thread health_;
  bool health_stop_ = false, stacks_poked_ = false;
  std::string status_;
  StacksRequested stacks_requested_;
  std::set<int64_t> mine_;  // requests this node made: not answered by itself
  std::unique_ptr<EtcdWatch> stacks_watch_;
};

}  // namespace

std::unique_ptr<RendezvousHandler> makeEtcdRendezvous(const EtcdRendezvousConfig& config) {
  return std::make_unique<EtcdRendezvous>(config);
}

}  // namespace ddpl::launcher
