#pragma once
// The etcd backend's class, in three files by concern: etcd_rendezvous.cc (its life, the job's
// outcome, the lease), etcd_join.cc (forming a round) and etcd_round_watch.cc (what ends a
// running round). Internal to the gRPC plugin. Design and key layout: etcd_rendezvous.cc.
#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/errors.h"
#include "launcher/membership/etcd/etcd_client.h"
#include "launcher/membership/etcd/etcd_rendezvous.h"
#include "launcher/membership/etcd/etcd_round_state.h"
#include "launcher/membership/multi_node_rendezvous.h"

namespace ddpl::launcher::etcd_detail {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

std::string seconds(milliseconds d);  // "30s"

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
  explicit EtcdRendezvous(const EtcdRendezvousConfig& c);

  ~EtcdRendezvous() override;

  bool roundStillCurrent() override;

  std::optional<int64_t> currentRound() const override {
    return current_ ? std::optional<int64_t>(current_->round) : std::nullopt;
  }
  std::string storeName(bool /*with_address*/) const override { return "etcd"; }
  void leaveAfterFailure() override {
    leaveQuietly(fmt::format("node {}'s worker group failed", c_.node_id));
  }

  // As recordFailure does once the workers are stopped: the others re-form at once.
  void leaveEarly() override { leaveQuietly(fmt::format("node {} left", c_.node_id)); }

  bool finish(bool success) override;

  void stopBeforeJoining(const std::string& reason) override;

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

  void checkConfig(const RoundState& s) const;

  // Takes a place in forming round `round` if the state is still the one read at `srev`
  // (0: there is none yet; then `open` is the state to create). Gives up the place held in
  // another round in the same transaction. False: the state moved on first.
  bool takePlace(int64_t round, int64_t srev, const RoundState* open = nullptr);

  // Gives up the place held in a round that did not take this node (or that it leaves before
  // it forms); touches the round's seq so that a count taken before does not close the round.
  void givePlace();

  // An etcd call that got no answer within the call timeout does not end the join: while
  // the join timeout allows, the joiner reads the state again and carries on, after a pause
  // drawn at random so that joiners do not come back together. 1024 agents starting at once
  // beside one etcd member on 2 cores had reads unanswered for 30 s, and every agent that
  // gave up made the whole job fail (issue 14). A round that formed is not retried here.
  std::optional<WorldAssignment> joinOnce() override;

  std::optional<WorldAssignment> joinUntil(Clock::time_point deadline, std::mt19937_64& rng);
  // joinUntil's step in a forming round where this node holds a place: closes the round when
  // its place is the oldest (it counts), else waits for a change (`rev`: the state's read).
  // Nothing: read the state again.
  std::optional<WorldAssignment> inFormingRound(const RoundState& s, int64_t srev, int64_t rev,
                                                Clock::time_point deadline);

  // A complete round that this node saw end but whose state nobody moved on yet: the node that
  // ended it (a leaving node, or the first member to see a death) writes the next state in
  // one transaction. If the state does not move within a lease TTL, that node died in
  // between: end the round here. True: moved it on.
  bool waitedOnEnded(const RoundState& s);

  // Waits for an event on `ranges` after `rev`, up to the join deadline (or `until`), or until
  // the agent stops;
  // throws at the deadline.
  void waitOrTimeout(Clock::time_point deadline,
                     const std::vector<std::pair<std::string, std::string>>& ranges, int64_t rev,
                     const RoundState& s, std::optional<Clock::time_point> until = std::nullopt);

  // The most places seen at once in forming round `round`: nodes that time out together give
  // up their places one by one, and the last to go would otherwise report itself alone.
  void noteJoined(int64_t round, int64_t n);

  [[noreturn]] void timedOut(const RoundState& s);

  // Compare-and-swap conflicts are rare here (opening or ending a round), but when several
  // nodes do it at once, they should not retry in lockstep.
  void backoff(std::mt19937_64& rng);

  // The counting node of forming round `s`: follows the places taken (its first read lists
  // them, then only what changed since), and closes the round once the rules of
  // rendezvous_state.h say so: at once when max nodes are in, or every node expected back
  // (and min) is; otherwise when the last call ends. Returns the world once this node closed
  // the round; nothing when the state moved on (or the counting moved to another node).
  std::optional<WorldAssignment> closeRound(const RoundState& s, int64_t srev,
                                            Clock::time_point deadline);
  // closeRound's steps: the wait for members of the ended round that still hold their places
  // (true: it waited), and the transaction that closes the round with `order`.
  bool waitForHolders(const RoundState& s, const std::set<std::string>& in,
                      Clock::time_point deadline, bool* told);
  std::optional<WorldAssignment> writeClosed(const RoundState& s, int64_t srev, int64_t seen,
                                             const std::vector<const EtcdKv*>& order, size_t taken);

  // The members of the round before forming round `s` that it expects back (s.expected), are
  // not among `in` (the places it would close with), and still hold their place in that round:
  // neither re-joined, left, nor lost their lease. `rev`: the revision of the read.
  std::vector<std::string> stillHolding(const RoundState& s, const std::set<std::string>& in,
                                        int64_t* rev);

  // The state's mod revision (0: none), without its value (a complete round's lists every node).
  int64_t stateRevision();

  // `closed_here`: this node's transaction completed the round.
  std::optional<WorldAssignment> assigned(const RoundState& s, int64_t state_rev,
                                          bool closed_here = false);

  void beforeJoin() override { watch_.reset(); }

  // The round's end, pushed by etcd: the state moving on (a node left, failed or wants in) or
  // a member's place vanishing with its lease (the node stopped keeping it alive). Watches
  // only the keys that can end the round, and the pings to answer.
  void startWatch(int64_t round, const std::vector<std::string>& members, int64_t rev);

  // Another member asks whether this node is alive: answering is the proof. False: `ev` is
  // no ping.
  bool answerPing(int64_t round, const std::string& ping_prefix, const EtcdEvent& ev);

  // Through the exit barrier a node only answers pings: the round's end no longer matters to
  // it, and watching the places would bring it every other node's leaving (N^2 events per
  // job). The new watch starts before the old one stops, from the round's start: a ping is
  // never missed, and one answered twice does no harm.
  void watchPingsOnly();

  // Ends complete round `round`, if its state is still the one written at `srev`: the next
  // round expects its members back, less `lost`. False: another node moved it on first.
  bool invalidate(int64_t round, int64_t srev, const std::vector<std::string>& members,
                  const std::string& lost, const std::string& why);

  void roundEnded(int64_t round, const std::string& why);

  void leaveQuietly(const std::string& why);

  // A call failed on the transport (no endpoint answered within the call timeout): etcd
  // counts as lost from now on (MultiNodeRendezvous::markLost).
  void noteTransport(const std::exception& e) override;

  void revokeLease();

  // Replaces lease `expired` with a fresh one, once, whichever thread finds it gone first (the
  // keep-alive thread, or the joiner whose transaction etcd refused for it).
  int64_t renewLease(int64_t expired);

  // etcd says this node's lease no longer exists (the agent was stopped, or etcd unreachable,
  // for its TTL): the others dropped this node, so the round is over for it, and a fresh lease
  // carries it into the next. On the keeper's thread, which then keeps the fresh lease it
  // returns.
  int64_t leaseExpired(int64_t id);

  // No keep-alive answered for 2/3 of the lease TTL (etcd unreachable from here): etcd may
  // drop this node at TTL and let the others re-form without it, so its round ends here now
  // and its workers stop within TTL/6 (SIGKILL then, whatever --shutdown-timeout says): gone
  // before its place can vanish (docs/network-faults.md has the margins). On the keeper's
  // thread.
  void fence(milliseconds silent);

  RoundsConfig c_;
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
  // The run's epoch (RoundState::epoch_ms) as last read: every state this node writes keeps it.
  int64_t epoch_ms_ = 0;
  bool left_ = false;
  std::atomic<bool> finishing_{false}, job_done_{false};
  // finish(): when the calls on the way out give up (none before: max).
  Clock::time_point close_by_ = Clock::time_point::max();
};

}  // namespace ddpl::launcher::etcd_detail
