#pragma once
// Membership rounds for agents, as plain C++: no gRPC, no threads, no clock of its own. Every
// call takes `now` from the caller (the server's monotonic clock, never a client's), and
// reports what happened in an Effects value that the caller acts on outside its lock
// (complete parked joins, tell watchers a round ended, log). That keeps it deterministic
// under test and lets a 100,000-rank simulation run in-process in seconds.
//
// Semantics (see docs/rendezvous.md):
//  - A run's round completes at once when max_nodes have joined, or last_call_timeout after
//    min_nodes have; if min_nodes never arrive within join_timeout of the first joiner, the
//    joiners fail with DEADLINE_EXCEEDED and the round starts over empty.
//  - Nodes arriving while a round is complete wait for the next one. If the round has room,
//    it is invalidated so that everyone re-joins with them.
//  - Group ranks follow node ids in sorted order, so a membership always maps to the same
//    ranks; rank offsets are prefix sums of local world sizes.
//  - A member whose heartbeats stop for the window, whose watch stream breaks, or that
//    leaves, ends the round for the others, who re-join; the run itself never closes.
//  - A node that stops before joining (withdraw(): its preflight failed) will not come. Until
//    a round forms, within a join timeout of the stop, the forming round waits for no more
//    nodes than can still come (max_nodes less the nodes stopped); when min_nodes can no
//    longer come, the round's joiners fail at once naming the stopped node and its reason, and
//    so do later joins, instead of each waiting out the join timeout. A complete round is not
//    disturbed.
//  - Fast re-formation: when a round ends, the nodes expected in the next one are the old
//    members that were not lost (evicted, left, stream broken) plus the nodes that were
//    waiting. Once all of them have joined again and at least min_nodes have, the round
//    completes at once instead of waiting out the last call. A run's first round has no
//    expected nodes and keeps the rules above; an expected node that never re-joins
//    leaves the normal rules (last call after min, join timeout) in charge.
//  - One group at a time: a survivor of the ended round that has not re-joined (not lost for
//    sure: it neither left nor was evicted nor broke its stream) may be cut from this server
//    and still training. Its agent stops its workers within the heartbeat window of its last
//    heartbeat (docs/network-faults.md), so the next round does not complete before then,
//    whatever else would complete it.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "rendezvous/store/store.h"

namespace ddpl::rdzv {

using TimePoint = Clock::time_point;

inline constexpr Duration kDefaultJoinTimeout{defaults::kJoinTimeout};
inline constexpr Duration kDefaultLastCallTimeout{defaults::kLastCallTimeout};
inline constexpr Duration kDefaultHeartbeatWindow{defaults::kHeartbeatWindow};
// How long a run with nobody in it (every node left, was evicted or gave up) is kept before
// it is forgotten with its keys; a node joining within that time finds it as it was.
inline constexpr Duration kDefaultRunRetention{std::chrono::minutes(10)};
// In the message of every join refused because a node stopped before joining (withdraw()):
// how a client tells that refusal from the others (version skew, duplicate id).
inline constexpr char kStoppedBeforeJoining[] = "stopped before joining";
// Longest timeout the state machine arms: larger ones (up to INT64_MAX ms from the wire) mean
// "wait very long" and are cut to this, never wrapped into the past.
inline constexpr Duration kMaxTimeout{std::chrono::hours(24 * 365 * 10)};

// Mirrors the canonical gRPC codes the service maps them to.
enum class RdzvCode {
  kOk,
  kInvalidArgument,
  kFailedPrecondition,
  kDeadlineExceeded,
  kResourceExhausted,
  kNotFound,
  kCancelled,
};

struct RdzvStatus {
  RdzvCode code = RdzvCode::kOk;
  std::string message;
  bool ok() const { return code == RdzvCode::kOk; }
};

struct RunConfig {
  int32_t min_nodes = 1;
  int32_t max_nodes = 1;
  Duration join_timeout = kDefaultJoinTimeout;
  Duration last_call_timeout = kDefaultLastCallTimeout;
};

struct NodeSpec {
  std::string node_id;
  int32_t local_world_size = 1;
  std::string version;
  std::string address;
};

struct JoinSpec {
  std::string run_id;
  NodeSpec node;
  RunConfig config;
};

// One completed round, shared (not copied) by every member's outcome.
struct RoundMembership {
  std::string run_id;
  int64_t round = 0;
  TimePoint run_created{};  // Run::created: a run forgotten and seen again counts anew
  int32_t world_size = 0;
  std::vector<NodeSpec> nodes;        // by group rank
  std::vector<int32_t> rank_offsets;  // by group rank
};

using JoinTicket = uint64_t;

struct JoinOutcome {
  JoinTicket ticket = 0;
  RdzvStatus status;
  std::shared_ptr<const RoundMembership> round;  // set when status is ok
  int32_t group_rank = -1;
};

struct Invalidation {
  std::string run_id;
  int64_t round = 0;
  std::string reason;
  int32_t nodes_waiting = 0;
};

struct Effects {
  std::vector<JoinOutcome> joins;  // parked joins that completed or failed
  std::vector<Invalidation> invalidated;
  std::vector<std::string> events;  // joins, leaves, evictions, rounds: for the server's log
  // Runs forgotten after their retention: the caller deletes their keys.
  std::vector<std::string> removed_runs;
};

struct RendezvousStateOptions {
  Duration heartbeat_window = kDefaultHeartbeatWindow;
  Duration run_retention = kDefaultRunRetention;
};

class RendezvousState {
 public:
  enum class Phase { kJoining, kComplete };
  struct RunStatus {
    int64_t round = 0;
    Phase phase = Phase::kJoining;
    int32_t joining = 0;
    int32_t members = 0;
    int32_t waiting = 0;
    int32_t expected = 0;  // nodes the forming round still expects to re-join (0: none)
  };

  explicit RendezvousState(RendezvousStateOptions options = {});

  // Validates and parks the node. Its outcome (success, or an error such as a duplicate node
  // id) appears in `fx.joins` under the returned ticket, in this call or a later one.
  JoinTicket join(const JoinSpec& spec, TimePoint now, Effects& fx);

  // The joiner stopped waiting (its call was cancelled): forget it without an outcome.
  void cancelJoin(JoinTicket ticket, TimePoint now, Effects& fx);

  RdzvStatus heartbeat(const std::string& run_id, const std::string& node_id, int64_t round,
                       TimePoint now, int32_t* nodes_waiting = nullptr);

  RdzvStatus leave(const std::string& run_id, const std::string& node_id, TimePoint now,
                   Effects& fx);

  struct Withdrawal {
    int32_t stopped = 0;   // nodes of the run stopped before joining, this one included
    int32_t can_come = 0;  // max_nodes less those: the most nodes the run can still have
    bool failed = false;   // min_nodes can no longer come: the forming round's joins failed
  };
  // `spec.node.node_id` stops before joining, for `reason` (its preflight's failures): see the
  // semantics above. `spec.config` is the run's shape, as a join would give it; the node's own
  // place in the run, if it had one, is given up as leave() does. Errors: as join's validation
  // (bad config, another shape than the run's).
  RdzvStatus withdraw(const JoinSpec& spec, const std::string& reason, TimePoint now, Effects& fx,
                      Withdrawal* out = nullptr);

  // OK when `node_id` is a member of `round` and that round is still the run's current one.
  RdzvStatus checkMember(const std::string& run_id, const std::string& node_id,
                         int64_t round) const;

  // The node's watch stream broke: evict it if it is still a member of `round`.
  void nodeLost(const std::string& run_id, const std::string& node_id, int64_t round,
                const std::string& why, TimePoint now, Effects& fx);

  // Applies every timeout due at `now`: last calls, join timeouts, missed heartbeats.
  void tick(TimePoint now, Effects& fx);

  // The earliest time at which tick() has something to do.
  std::optional<TimePoint> nextDeadline() const;

  std::optional<RunStatus> status(const std::string& run_id) const;
  const RendezvousStateOptions& options() const { return options_; }

  // Runs the server holds (forming, running, or empty and not yet past their retention).
  size_t runCount() const { return runs_.size(); }
  // The runs known now, at most `limit` (in id order).
  std::vector<std::string> runIds(size_t limit) const {
    std::vector<std::string> ids;
    for (auto it = runs_.begin(); it != runs_.end() && ids.size() < limit; ++it)
      ids.push_back(it->first);
    return ids;
  }
  // Runs examined by tick() and nextDeadline() since construction: the work a long-lived
  // server does per call, which must not grow with the runs that passed through it.
  uint64_t runsVisited() const { return runs_visited_; }

 private:
  struct Pending {
    JoinTicket ticket = 0;
    NodeSpec node;
  };
  struct Run {
    std::string id;
    TimePoint created{};  // when this state first saw the run (the fencing epoch counts from it)
    RunConfig config;
    std::string version;
    int64_t round = 0;
    Phase phase = Phase::kJoining;
    std::map<std::string, Pending> joining;  // sorted by node id: deterministic ranks
    std::optional<TimePoint> join_deadline;
    std::optional<TimePoint> last_call_deadline;
    std::shared_ptr<const RoundMembership> membership;
    std::unordered_map<std::string, TimePoint> last_seen;  // members of a complete round
    std::set<std::pair<TimePoint, std::string>> by_last_seen;
    std::map<std::string, Pending> waiting;  // arrived during a complete round
    // While a round re-forms after an invalidation: the nodes it expects (survivors of the
    // previous round and the nodes that were waiting), and how many of them have not joined.
    std::set<std::string> expected;
    size_t expected_missing = 0;
    // Survivors of the ended round that have not re-joined, and until when their agents may
    // still run its workers: a node that lost the server fences itself within the heartbeat
    // window of its last heartbeat, so no round forms without it before then (no two groups
    // train at once). Nodes lost for sure (evicted, left, stream broken) are not here.
    std::map<std::string, TimePoint> may_run;
    std::optional<TimePoint> empty_since;  // nobody joining, waiting or a member
    std::optional<TimePoint> indexed_at;   // its entry in deadlines_
    // Sum of the local world sizes of the joining, waiting and member nodes: what the next
    // round's world size can reach. Kept within int32 by admit().
    int64_t world_bound = 0;
    // Nodes that stopped before joining (withdraw()), with why, until stopped_until: the window
    // in which the other nodes of the same start would be joining.
    std::map<std::string, std::string> stopped;
    std::optional<TimePoint> stopped_until;

    bool empty() const { return joining.empty() && waiting.empty() && !membership; }
    bool isMember(const std::string& node) const { return last_seen.count(node) > 0; }
  };

  RdzvStatus validate(const JoinSpec& spec) const;
  RdzvStatus admit(Run& run, const JoinSpec& spec) const;
  void addJoiner(Run& run, Pending p, TimePoint now, Effects& fx);
  void complete(Run& run, TimePoint now, Effects& fx);
  void failJoining(Run& run, TimePoint now, Effects& fx);
  // Fails every joiner of the forming round with `code` and `msg`; the round starts over empty.
  void failJoiners(Run& run, RdzvCode code, const std::string& msg, Effects& fx);
  // The most nodes the run can still have: max_nodes less the nodes stopped before joining
  // (forgets the stopped ones past their window first).
  int32_t canCome(Run& run, TimePoint now);
  // The latest time until which a survivor of the ended round that has not re-joined may
  // still run workers (forgets the expired ones); nullopt if none.
  std::optional<TimePoint> mayRunUntil(Run& run, TimePoint now, std::string* who = nullptr);
  // Why a join into the forming round must fail now (min_nodes can no longer come); "" if not.
  std::string cannotForm(Run& run, TimePoint now);
  // Ends the complete round (telling its watchers why) and opens the next with the waiters.
  void invalidate(Run& run, const std::string& reason, TimePoint now, Effects& fx);
  void refreshDeadlines(Run& run, TimePoint now, Effects& fx);
  // A joiner of the forming round went away (cancelled or left): it is no longer expected.
  void forgetExpected(Run& run, const std::string& node);
  void touch(Run& run, const std::string& node, TimePoint now);
  void removeMember(Run& run, const std::string& node);
  // The earliest time tick() has something to do for this run.
  std::optional<TimePoint> deadlineOf(const Run& run) const;
  // After any change to `run`: refiles it in deadlines_ and notes when it became empty.
  void reindex(Run& run, TimePoint now);
  // Sum of the local world sizes of every node that may be in the run's next round.
  int64_t worldBound(const Run& run) const;
  int64_t memberWorld(const Run& run, const std::string& node) const;
  JoinTicket joinRun(Run& run, const JoinSpec& spec, JoinTicket ticket, TimePoint now, Effects& fx);
  RdzvStatus leaveRun(Run& run, const std::string& node_id, TimePoint now, Effects& fx);
  void tickRun(Run& run, TimePoint now, Effects& fx);

  RendezvousStateOptions options_;
  std::unordered_map<std::string, Run> runs_;
  std::unordered_map<JoinTicket, std::pair<std::string, std::string>> tickets_;  // run, node
  JoinTicket next_ticket_ = 1;
  // Every run with a deadline, earliest first: tick() and nextDeadline() look only at the
  // runs due, so their cost does not grow with the number of idle runs.
  std::set<std::pair<TimePoint, std::string>> deadlines_;
  uint64_t runs_visited_ = 0;
};

const char* toString(RdzvCode code);

// Why forming round `round` of a run of min:max nodes fails now that `stopped` (node id -> why)
// stopped before joining: min nodes can no longer come; "" while they still can. One wording
// for the gRPC service and the etcd backend (launcher/membership/etcd/etcd_rendezvous.cc).
std::string cannotFormMessage(const std::string& run_id, int64_t round, int32_t min_nodes,
                              int32_t max_nodes, const std::map<std::string, std::string>& stopped);

}  // namespace ddpl::rdzv
