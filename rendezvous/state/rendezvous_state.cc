#include "rendezvous/state/rendezvous_state.h"

#include <fmt/format.h>

#include <algorithm>

#include "rendezvous/state/round_rules.h"

namespace ddpl::rdzv {
namespace {

std::string seconds(Duration d) {
  if (d.count() % 1000 == 0) return fmt::format("{}s", d.count() / 1000);
  return fmt::format("{:.3g}s", d.count() / 1000.0);
}

std::string seconds(Clock::duration d) { return seconds(std::chrono::duration_cast<Duration>(d)); }

RdzvStatus err(RdzvCode code, std::string message) { return {code, std::move(message)}; }

}  // namespace

const char* toString(RdzvCode code) {
  switch (code) {
    case RdzvCode::kOk:
      return "OK";
    case RdzvCode::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case RdzvCode::kFailedPrecondition:
      return "FAILED_PRECONDITION";
    case RdzvCode::kDeadlineExceeded:
      return "DEADLINE_EXCEEDED";
    case RdzvCode::kResourceExhausted:
      return "RESOURCE_EXHAUSTED";
    case RdzvCode::kNotFound:
      return "NOT_FOUND";
    case RdzvCode::kCancelled:
      return "CANCELLED";
  }
  return "UNKNOWN";
}

RendezvousState::RendezvousState(RendezvousStateOptions options) : options_(options) {}

RdzvStatus RendezvousState::validate(const JoinSpec& s) const {
  if (s.run_id.empty()) return err(RdzvCode::kInvalidArgument, "join: the run id is empty");
  if (s.node.node_id.empty())
    return err(RdzvCode::kInvalidArgument,
               fmt::format("join run '{}': the node id is empty", s.run_id));
  if (s.node.local_world_size < 1)
    return err(RdzvCode::kInvalidArgument,
               fmt::format("join run '{}': node '{}' has local world size {} (must be >= 1)",
                           s.run_id, s.node.node_id, s.node.local_world_size));
  const auto& c = s.config;
  if (c.min_nodes < 1 || c.min_nodes > c.max_nodes)
    return err(RdzvCode::kInvalidArgument,
               fmt::format("join run '{}': nodes {}:{} is not a valid range (need 0 < min <= max)",
                           s.run_id, c.min_nodes, c.max_nodes));
  if (c.join_timeout.count() <= 0 || c.last_call_timeout.count() < 0)
    return err(RdzvCode::kInvalidArgument,
               fmt::format("join run '{}': join timeout {}ms and last-call timeout {}ms must be "
                           "positive",
                           s.run_id, c.join_timeout.count(), c.last_call_timeout.count()));
  return {};
}

RdzvStatus RendezvousState::admit(Run& run, const JoinSpec& s) const {
  const auto& node = s.node.node_id;
  if (run.empty()) return {};  // the first node of an idle run sets its shape and version
  if (run.config.min_nodes != s.config.min_nodes || run.config.max_nodes != s.config.max_nodes)
    return err(RdzvCode::kFailedPrecondition,
               fmt::format("run '{}' expects {}:{} nodes but node '{}' asks for {}:{}", run.id,
                           run.config.min_nodes, run.config.max_nodes, node, s.config.min_nodes,
                           s.config.max_nodes));
  if (run.version != s.node.version)
    return err(RdzvCode::kFailedPrecondition,
               fmt::format("version skew in run '{}': node '{}' runs '{}' but the run's nodes "
                           "run '{}'",
                           run.id, node, s.node.version, run.version));
  if (run.joining.count(node) || run.waiting.count(node))
    return err(RdzvCode::kFailedPrecondition,
               fmt::format("duplicate node id '{}': a node with that id is already waiting in "
                           "round {} of run '{}'",
                           node, run.round, run.id));
  // Ranks and world sizes are int32 on the wire and in every worker's environment.
  int64_t others = worldBound(run) - (run.isMember(node) ? memberWorld(run, node) : 0);
  if (others + s.node.local_world_size > INT32_MAX)
    return err(RdzvCode::kFailedPrecondition,
               fmt::format("run '{}': node '{}' with local world size {} would make the world "
                           "size {} (the other nodes have {}); the largest is {}",
                           run.id, node, s.node.local_world_size, others + s.node.local_world_size,
                           others, INT32_MAX));
  return {};
}

int64_t RendezvousState::worldBound(const Run& run) const { return run.world_bound; }

int64_t RendezvousState::memberWorld(const Run& run, const std::string& node) const {
  if (!run.membership) return 0;
  // By group rank, which follows node ids in sorted order.
  const auto& nodes = run.membership->nodes;
  auto it =
      std::lower_bound(nodes.begin(), nodes.end(), node,
                       [](const NodeSpec& n, const std::string& id) { return n.node_id < id; });
  return it != nodes.end() && it->node_id == node ? it->local_world_size : 0;
}

JoinTicket RendezvousState::join(const JoinSpec& asked, TimePoint now, Effects& fx) {
  JoinTicket ticket = next_ticket_++;
  RdzvStatus st = validate(asked);
  if (!st.ok()) {
    fx.joins.push_back({ticket, st, nullptr, -1});
    return ticket;
  }
  // Timeouts up to INT64_MAX ms mean "very long": cut to kMaxTimeout so that `now + timeout`
  // never wraps into the past (which would time the round out at once).
  JoinSpec spec = asked;
  spec.config.join_timeout = std::min(spec.config.join_timeout, kMaxTimeout);
  spec.config.last_call_timeout = std::min(spec.config.last_call_timeout, kMaxTimeout);
  Run& run = runs_[spec.run_id];
  if (run.id.empty()) run.created = now;
  run.id = spec.run_id;
  JoinTicket t = joinRun(run, spec, ticket, now, fx);
  reindex(run, now);
  return t;
}

JoinTicket RendezvousState::joinRun(Run& run, const JoinSpec& spec, JoinTicket ticket,
                                    TimePoint now, Effects& fx) {
  RdzvStatus st = admit(run, spec);
  if (!st.ok()) {
    fx.joins.push_back({ticket, st, nullptr, -1});
    return ticket;
  }
  if (run.empty()) {
    run.config = spec.config;
    run.version = spec.node.version;
  }
  const std::string& node = spec.node.node_id;
  Pending p{ticket, spec.node};

  run.stopped.erase(node);  // stopped before joining, and came after all

  if (run.phase == Phase::kJoining) {
    if (std::string why = cannotForm(run, now); !why.empty()) {
      fx.joins.push_back({ticket, err(RdzvCode::kFailedPrecondition, why), nullptr, -1});
      fx.events.push_back(fmt::format("run '{}': node '{}' refused: {}", run.id, node, why));
      return ticket;
    }
    if (static_cast<int32_t>(run.joining.size()) < run.config.max_nodes) {
      tickets_[ticket] = {run.id, node};
      addJoiner(run, std::move(p), now, fx);
      return ticket;
    }
    // Full, yet held open for a member of the last round that may still train (may_run): the
    // newcomer waits for the round after, as at a full complete round.
    run.may_run.erase(node);  // it joins again: its agent stopped its workers
  }

  // The round is complete (or forming, and full).
  if (run.isMember(node)) {
    // A member re-joining means its agent restarts its workers: everyone re-forms.
    tickets_[ticket] = {run.id, node};
    removeMember(run, node);
    run.world_bound += p.node.local_world_size;
    run.waiting.emplace(node, std::move(p));
    invalidate(run, fmt::format("node '{}' re-joined (restarting its workers)", node), now, fx);
    return ticket;
  }
  const size_t in_round = run.membership ? run.membership->nodes.size() : run.joining.size();
  if (static_cast<int32_t>(run.waiting.size()) >= run.config.max_nodes) {
    fx.joins.push_back(
        {ticket,
         err(RdzvCode::kResourceExhausted,
             fmt::format("run '{}' is full: round {} has {}/{} nodes and {} more are waiting; "
                         "node '{}' refused",
                         run.id, run.round, in_round, run.config.max_nodes, run.waiting.size(),
                         node)),
         nullptr, -1});
    return ticket;
  }
  tickets_[ticket] = {run.id, node};
  run.world_bound += p.node.local_world_size;
  run.waiting.emplace(node, std::move(p));
  fx.events.push_back(fmt::format("run '{}': node '{}' waits for the next round ({} waiting)",
                                  run.id, node, run.waiting.size()));
  if (run.phase == Phase::kJoining) {
    refreshDeadlines(run, now, fx);  // one fewer to wait for, perhaps
    return ticket;
  }
  int32_t members = static_cast<int32_t>(run.membership->nodes.size());
  if (members < run.config.max_nodes) {
    invalidate(run,
               fmt::format("node '{}' wants to join and round {} has room ({}/{} nodes)", node,
                           run.round, members, run.config.max_nodes),
               now, fx);
  }
  return ticket;
}

void RendezvousState::addJoiner(Run& run, Pending p, TimePoint now, Effects& fx) {
  std::string node = p.node.node_id;
  run.world_bound += p.node.local_world_size;
  run.joining.emplace(node, std::move(p));
  run.may_run.erase(node);
  if (run.expected.count(node)) --run.expected_missing;
  if (run.joining.size() == 1) run.join_deadline = now + run.config.join_timeout;
  fx.events.push_back(fmt::format("run '{}': node '{}' joined round {} ({}/{} nodes, min {})",
                                  run.id, node, run.round, run.joining.size(), run.config.max_nodes,
                                  run.config.min_nodes));
  refreshDeadlines(run, now, fx);
}

void RendezvousState::refreshDeadlines(Run& run, TimePoint now, Effects& fx) {
  auto n = static_cast<int32_t>(run.joining.size());
  if (n == 0) {
    run.join_deadline.reset();
    run.last_call_deadline.reset();
    return;
  }
  round_rules::FormingRound forming;
  forming.joined = n;
  forming.min_nodes = run.config.min_nodes;
  // Nodes that stopped before joining will not come: no waiting for them.
  forming.can_come = canCome(run, now);
  forming.all_expected_back = !run.expected.empty() && run.expected_missing == 0;
  round_rules::Closing closing = round_rules::closing(forming);
  if (closing == round_rules::Closing::kEveryoneWhoCanCome ||
      closing == round_rules::Closing::kLastCall) {
    std::string who;
    if (auto until = mayRunUntil(run, now, &who)) {
      // Completing now could start a group while a cut-off node's workers still train.
      // Everyone who can come is here but for it: the round completes when it has stopped.
      TimePoint at = closing == round_rules::Closing::kEveryoneWhoCanCome ? *until
                     : run.last_call_deadline ? *run.last_call_deadline
                                              : now + run.config.last_call_timeout;
      if (at < *until) at = *until;
      if (at == *until && run.last_call_deadline != at)
        fx.events.push_back(fmt::format(
            "run '{}': round {} waits up to {} for {} to stop its workers (a member of round {} "
            "that has not re-joined; its agent fences itself within the heartbeat window of {} "
            "after its last heartbeat)",
            run.id, run.round, seconds(*until - now), who, run.round - 1,
            seconds(options_.heartbeat_window)));
      run.last_call_deadline = at;
      return;
    }
  }
  switch (closing) {
    case round_rules::Closing::kEveryoneWhoCanCome:
      if (n < run.config.max_nodes)
        fx.events.push_back(fmt::format(
            "run '{}': round {} has every node that can still come ({}/{}; {} {}): completing",
            run.id, run.round, n, run.config.max_nodes, run.stopped.size(), kStoppedBeforeJoining));
      complete(run, now, fx);
      return;
    case round_rules::Closing::kAllExpectedBack:
      fx.events.push_back(fmt::format(
          "run '{}': all {} expected nodes re-joined round {}: completing without last call",
          run.id, run.expected.size(), run.round));
      complete(run, now, fx);
      return;
    case round_rules::Closing::kLastCall:
      if (!run.last_call_deadline) run.last_call_deadline = now + run.config.last_call_timeout;
      if (run.config.last_call_timeout.count() == 0) complete(run, now, fx);
      return;
    case round_rules::Closing::kNotYet:
      run.last_call_deadline.reset();
      return;
  }
}

void RendezvousState::complete(Run& run, TimePoint now, Effects& fx) {
  auto m = std::make_shared<RoundMembership>();
  m->run_id = run.id;
  m->round = run.round;
  m->run_created = run.created;
  m->nodes.reserve(run.joining.size());
  std::vector<int> local_world_sizes;
  local_world_sizes.reserve(run.joining.size());
  for (auto& [id, p] : run.joining) {
    local_world_sizes.push_back(p.node.local_world_size);
    m->nodes.push_back(p.node);
  }
  // admit() keeps the world within int32.
  round_rules::RankLayout layout = round_rules::rankLayout(local_world_sizes);
  m->rank_offsets.reserve(layout.offsets.size());
  for (int64_t offset : layout.offsets) m->rank_offsets.push_back(static_cast<int32_t>(offset));
  m->world_size = static_cast<int32_t>(layout.world_size);
  run.membership = m;
  // The stops concerned the round being formed; a later one (a node lost, another started in
  // a stopped node's place) is not held to them.
  run.stopped.clear();
  run.stopped_until.reset();
  run.phase = Phase::kComplete;
  run.join_deadline.reset();
  run.last_call_deadline.reset();
  run.expected.clear();
  run.expected_missing = 0;
  run.may_run.clear();
  int32_t rank = 0;
  for (auto& [id, p] : run.joining) {
    touch(run, id, now);
    tickets_.erase(p.ticket);
    fx.joins.push_back({p.ticket, {}, m, rank++});
  }
  run.joining.clear();
  fx.events.push_back(fmt::format("run '{}': round {} complete with {} nodes, world size {}",
                                  run.id, run.round, m->nodes.size(), m->world_size));
}

void RendezvousState::failJoining(Run& run, TimePoint now, Effects& fx) {
  (void)now;
  std::string msg = fmt::format(
      "run '{}': round {} timed out after {} (join timeout) with {}/{} nodes joined (min {})",
      run.id, run.round, seconds(run.config.join_timeout), run.joining.size(), run.config.max_nodes,
      run.config.min_nodes);
  failJoiners(run, RdzvCode::kDeadlineExceeded, msg, fx);
}

void RendezvousState::failJoiners(Run& run, RdzvCode code, const std::string& msg, Effects& fx) {
  for (auto& [id, p] : run.joining) {
    tickets_.erase(p.ticket);
    run.world_bound -= p.node.local_world_size;
    fx.joins.push_back({p.ticket, err(code, msg), nullptr, -1});
  }
  run.joining.clear();
  run.join_deadline.reset();
  run.last_call_deadline.reset();
  run.expected.clear();  // the round starts over empty, as a fresh one
  run.expected_missing = 0;
  fx.events.push_back(msg);
}

void RendezvousState::invalidate(Run& run, const std::string& reason, TimePoint now, Effects& fx) {
  fx.invalidated.push_back({run.id, run.round, reason, static_cast<int32_t>(run.waiting.size())});
  fx.events.push_back(fmt::format("run '{}': round {} ended: {}", run.id, run.round, reason));
  // Callers have already removed a lost member from last_seen; a member re-joining sits in
  // waiting. So the survivors plus the waiters are exactly the nodes expected back.
  run.expected.clear();
  for (const auto& [id, seen] : run.last_seen) run.expected.insert(id);
  for (const auto& [id, p] : run.waiting) run.expected.insert(id);
  run.expected_missing = run.expected.size() - run.waiting.size();
  // The survivors are expected back, but count again only once they re-join.
  for (const auto& [id, seen] : run.last_seen) run.world_bound -= memberWorld(run, id);
  for (const auto& [id, seen] : run.last_seen) run.may_run[id] = seen + options_.heartbeat_window;
  run.membership.reset();
  run.last_seen.clear();
  run.by_last_seen.clear();
  run.round += 1;
  run.phase = Phase::kJoining;
  auto waiting = std::move(run.waiting);
  run.waiting.clear();
  for (auto& [id, p] : waiting) {
    run.joining.emplace(id, std::move(p));
  }
  if (!run.joining.empty()) run.join_deadline = now + run.config.join_timeout;
  refreshDeadlines(run, now, fx);
}

void RendezvousState::touch(Run& run, const std::string& node, TimePoint now) {
  auto it = run.last_seen.find(node);
  if (it != run.last_seen.end()) {
    run.by_last_seen.erase({it->second, node});
    it->second = now;
  } else {
    run.last_seen.emplace(node, now);
  }
  run.by_last_seen.insert({now, node});
}

void RendezvousState::forgetExpected(Run& run, const std::string& node) {
  // Only called for a node that had joined, so it was not counted as missing.
  run.expected.erase(node);
}

void RendezvousState::removeMember(Run& run, const std::string& node) {
  auto it = run.last_seen.find(node);
  if (it == run.last_seen.end()) return;
  run.world_bound -= memberWorld(run, node);
  run.by_last_seen.erase({it->second, node});
  run.last_seen.erase(it);
}

void RendezvousState::cancelJoin(JoinTicket ticket, TimePoint now, Effects& fx) {
  auto t = tickets_.find(ticket);
  if (t == tickets_.end()) return;
  std::string run_id = t->second.first, node = t->second.second;
  tickets_.erase(t);
  auto r = runs_.find(run_id);
  if (r == runs_.end()) return;
  Run& run = r->second;
  auto match = [&](std::map<std::string, Pending>& m) {
    auto it = m.find(node);
    if (it != m.end() && it->second.ticket == ticket) {
      run.world_bound -= it->second.node.local_world_size;
      m.erase(it);
      return true;
    }
    return false;
  };
  if (match(run.joining)) {
    forgetExpected(run, node);  // its call went away: treat it as lost, like a broken stream
    fx.events.push_back(
        fmt::format("run '{}': node '{}' stopped waiting for round {}", run_id, node, run.round));
    refreshDeadlines(run, now, fx);
  } else if (match(run.waiting)) {
    fx.events.push_back(
        fmt::format("run '{}': node '{}' stopped waiting for the next round", run_id, node));
  }
  reindex(run, now);
}

RdzvStatus RendezvousState::heartbeat(const std::string& run_id, const std::string& node_id,
                                      int64_t round, TimePoint now, int32_t* nodes_waiting) {
  RdzvStatus st = checkMember(run_id, node_id, round);
  if (!st.ok()) return st;
  Run& run = runs_.at(run_id);
  touch(run, node_id, now);
  reindex(run, now);
  if (nodes_waiting) *nodes_waiting = static_cast<int32_t>(run.waiting.size());
  return {};
}

RdzvStatus RendezvousState::checkMember(const std::string& run_id, const std::string& node_id,
                                        int64_t round) const {
  auto r = runs_.find(run_id);
  if (r == runs_.end())
    return err(RdzvCode::kNotFound, fmt::format("no run '{}' on this server", run_id));
  const Run& run = r->second;
  if (run.phase != Phase::kComplete || run.round != round)
    return err(
        RdzvCode::kFailedPrecondition,
        fmt::format("round {} of run '{}' is no longer current (the run is {} round {})", round,
                    run_id, run.phase == Phase::kComplete ? "in" : "forming", run.round));
  if (!run.isMember(node_id))
    return err(RdzvCode::kNotFound, fmt::format("node '{}' is not a member of round {} of run '{}'",
                                                node_id, round, run_id));
  return {};
}

RdzvStatus RendezvousState::leave(const std::string& run_id, const std::string& node_id,
                                  TimePoint now, Effects& fx) {
  auto r = runs_.find(run_id);
  if (r == runs_.end())
    return err(RdzvCode::kNotFound, fmt::format("no run '{}' on this server", run_id));
  Run& run = r->second;
  RdzvStatus st = leaveRun(run, node_id, now, fx);
  reindex(run, now);
  return st;
}

RdzvStatus RendezvousState::leaveRun(Run& run, const std::string& node_id, TimePoint now,
                                     Effects& fx) {
  const std::string& run_id = run.id;
  for (auto* m : {&run.joining, &run.waiting}) {
    auto it = m->find(node_id);
    if (it == m->end()) continue;
    JoinTicket ticket = it->second.ticket;
    tickets_.erase(ticket);
    run.world_bound -= it->second.node.local_world_size;
    m->erase(it);
    fx.joins.push_back({ticket,
                        err(RdzvCode::kCancelled,
                            fmt::format("node '{}' left run '{}' while joining", node_id, run_id)),
                        nullptr, -1});
    fx.events.push_back(
        fmt::format("run '{}': node '{}' left before its round formed", run_id, node_id));
    if (m == &run.joining) {
      forgetExpected(run, node_id);
      refreshDeadlines(run, now, fx);
    }
    return {};
  }
  if (run.phase == Phase::kComplete && run.isMember(node_id)) {
    removeMember(run, node_id);
    invalidate(run, fmt::format("node '{}' left", node_id), now, fx);
    return {};
  }
  if (run.phase == Phase::kJoining && run.expected.erase(node_id)) {
    // A survivor of the previous round leaves instead of re-joining: stop waiting for it.
    --run.expected_missing;
    run.may_run.erase(node_id);
    fx.events.push_back(fmt::format("run '{}': node '{}' left; round {} no longer expects it",
                                    run_id, node_id, run.round));
    refreshDeadlines(run, now, fx);
    return {};
  }
  return err(RdzvCode::kNotFound,
             fmt::format("node '{}' is not part of run '{}'", node_id, run_id));
}

int32_t RendezvousState::canCome(Run& run, TimePoint now) {
  if (run.stopped_until && now >= *run.stopped_until) {
    run.stopped.clear();  // past the window: a fresh start of the job may succeed
    run.stopped_until.reset();
  }
  return run.config.max_nodes - static_cast<int32_t>(run.stopped.size());
}

std::string cannotFormMessage(const std::string& run_id, int64_t round, int32_t min_nodes,
                              int32_t max_nodes,
                              const std::map<std::string, std::string>& stopped) {
  int64_t can_come = int64_t{max_nodes} - static_cast<int64_t>(stopped.size());
  if (stopped.empty() || can_come >= min_nodes) return "";
  // A few are named in full; a thousand would make a message nobody reads.
  constexpr size_t kNamed = 3;
  std::string who;
  size_t i = 0;
  for (const auto& [id, why] : stopped) {
    if (i++ == kNamed) break;
    who +=
        fmt::format("{}node '{}' {}: {}", who.empty() ? "" : "; ", id, kStoppedBeforeJoining, why);
  }
  if (stopped.size() > kNamed) who += fmt::format("; and {} more", stopped.size() - kNamed);
  return fmt::format(
      "run '{}' cannot form: {}; round {} needs at least {} of {} nodes and at most {} can still "
      "come",
      run_id, who, round, min_nodes, max_nodes, std::max<int64_t>(can_come, 0));
}

std::optional<TimePoint> RendezvousState::mayRunUntil(Run& run, TimePoint now, std::string* who) {
  std::optional<TimePoint> latest;
  size_t pending = 0;
  for (auto it = run.may_run.begin(); it != run.may_run.end();) {
    if (it->second <= now) {
      it = run.may_run.erase(it);
      continue;
    }
    if (!run.joining.count(it->first)) {
      ++pending;
      if (!latest || *latest < it->second) {
        latest = it->second;
        if (who) *who = fmt::format("node '{}'", it->first);
      }
    }
    ++it;
  }
  if (who && pending > 1) *who += fmt::format(" and {} more", pending - 1);
  return latest;
}

std::string RendezvousState::cannotForm(Run& run, TimePoint now) {
  canCome(run, now);  // forgets the stale ones
  return cannotFormMessage(run.id, run.round, run.config.min_nodes, run.config.max_nodes,
                           run.stopped);
}

RdzvStatus RendezvousState::withdraw(const JoinSpec& asked, const std::string& reason,
                                     TimePoint now, Effects& fx, Withdrawal* out) {
  RdzvStatus st = validate(asked);
  if (!st.ok()) return st;
  JoinSpec spec = asked;
  spec.config.join_timeout = std::min(spec.config.join_timeout, kMaxTimeout);
  spec.config.last_call_timeout = std::min(spec.config.last_call_timeout, kMaxTimeout);
  const std::string& node = spec.node.node_id;
  if (auto r = runs_.find(spec.run_id); r != runs_.end() && !r->second.empty()) {
    const RunConfig& c = r->second.config;
    if (c.min_nodes != spec.config.min_nodes || c.max_nodes != spec.config.max_nodes)
      return err(RdzvCode::kFailedPrecondition,
                 fmt::format("run '{}' expects {}:{} nodes but node '{}' (stopping before "
                             "joining) asks for {}:{}",
                             spec.run_id, c.min_nodes, c.max_nodes, node, spec.config.min_nodes,
                             spec.config.max_nodes));
  }
  Run& run = runs_[spec.run_id];
  if (run.id.empty()) run.created = now;
  run.id = spec.run_id;
  if (run.empty()) run.config = spec.config;
  if (run.joining.count(node) || run.waiting.count(node) || run.isMember(node))
    leaveRun(run, node, now, fx);
  // The reason comes from the wire: bounded, it is repeated in every refusal.
  constexpr size_t kMaxReason = 2000;
  std::string why = reason.size() > kMaxReason ? reason.substr(0, kMaxReason) + "..." : reason;
  Withdrawal w;
  if (run.phase == Phase::kJoining) {
    canCome(run, now);  // forgets stale ones first
    run.may_run.erase(node);  // its agent stopped: no workers of it run
    run.stopped[node] = why;
    TimePoint until = now + spec.config.join_timeout;
    if (!run.stopped_until || *run.stopped_until < until) run.stopped_until = until;
    w.can_come = canCome(run, now);
    fx.events.push_back(
        fmt::format("run '{}': node '{}' {}: {} ({} of {} nodes can still come, min {})", run.id,
                    node, kStoppedBeforeJoining, why, std::max(w.can_come, 0), run.config.max_nodes,
                    run.config.min_nodes));
    if (std::string msg = cannotForm(run, now); !msg.empty()) {
      w.failed = true;
      failJoiners(run, RdzvCode::kFailedPrecondition, msg, fx);
    } else {
      refreshDeadlines(run, now, fx);  // may complete now with every node that can come
    }
  } else {
    // The running round never needed it; the next one is not held to it either (a node
    // started later in its place may pass its checks).
    w.can_come = run.config.max_nodes;
    fx.events.push_back(fmt::format("run '{}': node '{}' {}: {} (round {} runs without it)", run.id,
                                    node, kStoppedBeforeJoining, why, run.round));
  }
  w.stopped = static_cast<int32_t>(run.stopped.size());
  reindex(run, now);
  if (out) *out = w;
  return {};
}

void RendezvousState::nodeLost(const std::string& run_id, const std::string& node_id, int64_t round,
                               const std::string& why, TimePoint now, Effects& fx) {
  if (!checkMember(run_id, node_id, round).ok()) return;  // the round already moved on
  Run& run = runs_.at(run_id);
  removeMember(run, node_id);
  invalidate(run, fmt::format("node '{}' evicted: {}", node_id, why), now, fx);
  reindex(run, now);
}

void RendezvousState::tick(TimePoint now, Effects& fx) {
  // Only the runs due: an idle run costs nothing here until its retention ends.
  std::vector<std::string> due;
  while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
    auto node = deadlines_.extract(deadlines_.begin());
    due.push_back(std::move(node.value().second));
  }
  for (const auto& id : due) {
    auto r = runs_.find(id);
    if (r == runs_.end()) continue;
    ++runs_visited_;
    Run& run = r->second;
    run.indexed_at.reset();
    tickRun(run, now, fx);
    if (run.empty() && run.empty_since && *run.empty_since + options_.run_retention <= now) {
      fx.events.push_back(fmt::format("run '{}': forgotten after {} with no nodes (round {})",
                                      run.id, seconds(options_.run_retention), run.round));
      fx.removed_runs.push_back(run.id);
      runs_.erase(r);
      continue;
    }
    reindex(run, now);
  }
}

void RendezvousState::tickRun(Run& run, TimePoint now, Effects& fx) {
  if (run.phase == Phase::kJoining) {
    if (run.last_call_deadline && now >= *run.last_call_deadline) {
      complete(run, now, fx);
    } else if (run.join_deadline && now >= *run.join_deadline &&
               static_cast<int32_t>(run.joining.size()) < run.config.min_nodes) {
      failJoining(run, now, fx);
    }
    return;
  }
  // Complete: evict members whose last heartbeat is older than the window.
  std::vector<std::string> stale;
  Clock::duration worst{};
  for (const auto& [seen, node] : run.by_last_seen) {
    if (seen + options_.heartbeat_window > now) break;
    stale.push_back(node);
    worst = std::max(worst, now - seen);
  }
  if (stale.empty()) return;
  for (const auto& n : stale) removeMember(run, n);
  std::string who = fmt::format("'{}'", stale.front());
  if (stale.size() > 1) who += fmt::format(" and {} more", stale.size() - 1);
  invalidate(run,
             fmt::format("node {} evicted: no heartbeat for {} (window {})", who, seconds(worst),
                         seconds(options_.heartbeat_window)),
             now, fx);
}

std::optional<TimePoint> RendezvousState::deadlineOf(const Run& run) const {
  std::optional<TimePoint> best;
  auto consider = [&](std::optional<TimePoint> t) {
    if (t && (!best || *t < *best)) best = t;
  };
  if (run.empty()) {
    if (run.empty_since) consider(*run.empty_since + options_.run_retention);
  } else if (run.phase == Phase::kJoining) {
    consider(run.last_call_deadline);
    if (static_cast<int32_t>(run.joining.size()) < run.config.min_nodes)
      consider(run.join_deadline);
  } else if (!run.by_last_seen.empty()) {
    consider(run.by_last_seen.begin()->first + options_.heartbeat_window);
  }
  return best;
}

void RendezvousState::reindex(Run& run, TimePoint now) {
  if (run.empty()) {
    if (!run.empty_since) run.empty_since = now;
  } else {
    run.empty_since.reset();
  }
  auto at = deadlineOf(run);
  if (at == run.indexed_at) return;
  if (run.indexed_at) deadlines_.erase({*run.indexed_at, run.id});
  run.indexed_at = at;
  if (at) deadlines_.insert({*at, run.id});
}

std::optional<TimePoint> RendezvousState::nextDeadline() const {
  if (deadlines_.empty()) return std::nullopt;
  return deadlines_.begin()->first;
}

std::optional<RendezvousState::RunStatus> RendezvousState::status(const std::string& run_id) const {
  auto r = runs_.find(run_id);
  if (r == runs_.end()) return std::nullopt;
  const Run& run = r->second;
  RunStatus s;
  s.round = run.round;
  s.phase = run.phase;
  s.joining = static_cast<int32_t>(run.joining.size());
  s.members = static_cast<int32_t>(run.last_seen.size());
  s.waiting = static_cast<int32_t>(run.waiting.size());
  s.expected = static_cast<int32_t>(run.expected.size());
  return s;
}

}  // namespace ddpl::rdzv
