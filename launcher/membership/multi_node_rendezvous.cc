#include "launcher/membership/multi_node_rendezvous.h"

#include <fmt/format.h>

#include <regex>

#include "common/errors.h"
#include "common/log.h"

namespace ddpl::launcher {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// The health thread publishes this node's status this often (a node summary, not a message
// per step). Where the store cannot push, it looks for another node's request for stacks this
// often (one read a second per node).
constexpr milliseconds kStatusEvery{std::chrono::seconds(5)};
constexpr milliseconds kStacksPoll{std::chrono::seconds(1)};
// How long the loop waits for a request for stacks to be made: a store that answers takes
// milliseconds; a node cut off from it must still fence itself on time (2/3 of the server's
// window after its last heartbeat, 6 s with a 9 s window), which it does from the loop.
constexpr milliseconds kStacksRequestWait{std::chrono::seconds(1)};
// Requests for stacks and answers the loop may hand the health thread before it has sent them:
// far above one hang's, a bound for a store that stopped answering.
constexpr size_t kMaxQueuedHealthCalls = 16;
// Calls the agent makes for the user (`launch status`) or on a hang wait at most this long in
// all.
constexpr milliseconds kHealthCallTimeout{std::chrono::seconds(3)};

double unixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

MultiNodeRendezvous::MultiNodeRendezvous(std::string node_id) : node_id_(std::move(node_id)) {}

int MultiNodeRendezvous::recordFailure(const std::string& summary) {
  std::string why;
  // Each call would wait out the call timeout for a store that is gone (as the probe of
  // roundStillCurrent() just before found); the agent gives up on the count at once instead
  // (and the job's outcome is this node's own failure).
  if (lost(&why)) throw NetworkError(storeName(true) + " is lost: " + why);
  try {
    auto round = currentRound();
    // One fault is often found by several nodes in the same instant (a hang stalls every rank
    // in the collective; each node's monitor sees its own ranks stop). The probe of
    // roundStillCurrent() cannot order them, so the round's own counter does: the first failure
    // of a round is the job's, and the root cause; the others are that failure seen from
    // elsewhere and neither count against --max-restarts nor replace the root cause.
    if (round && kv_->add(fmt::format("round/{}/failed", *round), 1) > 1) {
      leaveAfterFailure();
      return failureCount();
    }
    int n = static_cast<int>(kv_->add("failures", 1));
    kv_->set("last_failure", summary);
    if (round) kv_->set(fmt::format("round/{}/end", *round), "failed");
    leaveAfterFailure();
    return n;
  } catch (const std::exception& e) {
    noteTransport(e);
    throw;
  }
}

std::string MultiNodeRendezvous::jobFailure() {
  if (!cached_failure_.empty()) return cached_failure_;
  std::string why;
  if (lost(&why)) return "<could not read it: " + storeName(false) + " is lost: " + why + ">";
  try {
    auto v = kv_->getOutcome("last_failure");
    return v ? *v : "";
  } catch (const std::exception& e) {
    noteTransport(e);
    return std::string("<could not read it: ") + e.what() + ">";
  }
}

std::optional<WorldAssignment> MultiNodeRendezvous::failedForGood(const std::string& run_id,
                                                                  int max_restarts) {
  int failures = failureCount();
  if (failures <= max_restarts) return std::nullopt;
  WorldAssignment w;
  w.run_id = run_id;
  w.restart_count = failures;
  return w;
}

std::optional<std::string> MultiNodeRendezvous::exitBarrier(int64_t round, int nodes,
                                                            milliseconds timeout) {
  // A tally, not a shared counter: N nodes finishing together would otherwise retry their
  // compare-and-swap against each other (etcd).
  if (kv_->tally(fmt::format("round/{}/done", round), node_id_) >= nodes)
    kv_->set(fmt::format("round/{}/end", round), "done");
  // Leaving ends the round for nodes still running, so wait for them: returns at once when the
  // last node is done or any node failed.
  return kv_->waitFor(fmt::format("round/{}/end", round), timeout);
}

int64_t MultiNodeRendezvous::countGone(int64_t round) {
  return kv_->tally(fmt::format("round/{}/gone", round), node_id_);
}

int MultiNodeRendezvous::failureCount() { return static_cast<int>(kv_->add("failures", 0)); }

MultiNodeRendezvous::~MultiNodeRendezvous() { stopThreads(); }

void MultiNodeRendezvous::stopThreads() {
  stopHealth();
  if (joiner_.joinable()) joiner_.join();
}

void MultiNodeRendezvous::waitForJoiner() {
  if (joiner_.joinable()) joiner_.join();
}

void MultiNodeRendezvous::startRendezvous(Done done) {
  if (joiner_.joinable()) joiner_.join();
  beforeJoin();
  // Joining blocks until the round completes (up to the join timeout): a thread of its own,
  // so the agent keeps handling signals meanwhile.
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_end_.reset();
  }
  joiner_ = std::thread([this, done = std::move(done)] {
    std::optional<WorldAssignment> w;
    try {
      w = joinOnce();
    } catch (const std::exception& e) {
      done(std::nullopt, e.what());
      return;
    }
    done(w, "");
    if (w) delivered(w->round);
  });
}

void MultiNodeRendezvous::delivered(int64_t round) {
  std::optional<std::pair<int64_t, std::string>> end;
  {
    std::lock_guard<std::mutex> lock(mu_);
    delivered_round_ = round;
    if (pending_end_ && pending_end_->first == round) end = pending_end_;
    pending_end_.reset();
  }
  if (end && ended_) ended_(end->first, end->second);
}

void MultiNodeRendezvous::endRound(int64_t round, const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (round > delivered_round_) {
      // Its join is still finishing: the agent would take this for news of an older round.
      if (!pending_end_) pending_end_ = {round, why};
      return;
    }
  }
  if (ended_) ended_(round, why);
}

std::tuple<int, int, int64_t> MultiNodeRendezvous::position() {
  std::lock_guard<std::mutex> lock(mu_);
  return {rank_, nodes_, round_};
}

void MultiNodeRendezvous::markLost(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!lost_) lost_why_ = why;
  lost_ = true;
}

void MultiNodeRendezvous::markFenced(int64_t round, double stop_within) {
  std::lock_guard<std::mutex> lock(mu_);
  fenced_ = {round, stop_within};
}

std::optional<double> MultiNodeRendezvous::fencedStopWithin(int64_t round) {
  std::lock_guard<std::mutex> lock(mu_);
  if (fenced_ && fenced_->first == round) return fenced_->second;
  return std::nullopt;
}

void MultiNodeRendezvous::clearLost() {
  std::lock_guard<std::mutex> lock(mu_);
  lost_ = false;
  lost_why_.clear();
  told_skipping_ = false;
}

bool MultiNodeRendezvous::lost(std::string* why) {
  if (!lost_) return false;
  std::lock_guard<std::mutex> lock(mu_);
  if (why) *why = lost_why_;
  return lost_;
}

bool MultiNodeRendezvous::mayCall(Clock::time_point by, const std::string& what) {
  std::string why;
  if (lost(&why)) {
    why = "the rendezvous store was lost: " + why;
  } else if (Clock::now() >= by) {
    why = "the time to close the rendezvous is up";
  } else {
    return true;
  }
  bool first;
  {
    std::lock_guard<std::mutex> lock(mu_);
    first = !told_skipping_;
    told_skipping_ = true;
  }
  if (first)
    log::warn("not {} ({})", what, why);
  else
    log::debug("not {} ({})", what, why);
  return false;
}

void MultiNodeRendezvous::roundAssigned(int group_rank, int group_world_size, int64_t round) {
  std::lock_guard<std::mutex> lock(mu_);
  rank_ = group_rank;
  nodes_ = group_world_size;
  round_ = round;
  if (!health_.joinable() && !health_stop_) health_ = std::thread([this] { healthLoop(); });
}

void MultiNodeRendezvous::stopHealth() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    health_stop_ = true;
  }
  cv_.notify_all();
  if (health_.joinable()) health_.join();
}

void MultiNodeRendezvous::publishPreflight(const std::string& report) {
  try {
    kv_->append("preflight", node_id_, report);
  } catch (const std::exception& e) {
    log::warn("cannot publish this node's preflight to the job: {}", e.what());
  }
}

void MultiNodeRendezvous::logPreflightTable() {
  try {
    std::string table;
    int problems = 0, reports = 0;
    for (const auto& r : kv_->readNew("preflight", &preflight_cursor_)) {
      problems += r.find('\n') != std::string::npos;
      ++reports;
      table += "\n  " + std::regex_replace(r, std::regex("\n"), "\n    ");
    }
    if (reports == 0) return;
    if (problems > 0)
      log::warn("preflight of the job, {} node(s) reporting, {} with findings:{}", reports,
                problems, table);
    else
      log::info("preflight of the job, {} node(s) reporting, all ok:{}", reports, table);
  } catch (const std::exception& e) {
    log::debug("no preflight table: {}", e.what());
  }
}

void MultiNodeRendezvous::publishStatus(const std::string& line) {
  std::lock_guard<std::mutex> lock(mu_);
  status_ = line;
}

std::vector<std::string> MultiNodeRendezvous::otherNodesStatus() {
  auto [me, nodes, round] = position();
  std::vector<std::string> out;
  auto deadline = Clock::now() + kHealthCallTimeout;
  for (int r = 0; r < nodes; ++r) {
    if (r == me) continue;
    try {
      std::optional<std::string> v;
      if (Clock::now() <= deadline) v = kv_->get(fmt::format("status/{}", r));
      // "<round>\n<host>\n<unix time>\n<line>"
      size_t a = v ? v->find('\n') : std::string::npos;
      size_t b = a == std::string::npos ? a : v->find('\n', a + 1);
      size_t c = b == std::string::npos ? b : v->find('\n', b + 1);
      if (c == std::string::npos || v->substr(0, a) != std::to_string(round)) {
        out.push_back(fmt::format("node {}: no status published in round {} yet", r, round));
        continue;
      }
      double age = unixSeconds() - std::strtod(v->substr(b + 1, c - b - 1).c_str(), nullptr);
      out.push_back(fmt::format("node {} ({}): {} ({:.0f}s ago)", r, v->substr(a + 1, b - a - 1),
                                v->substr(c + 1), std::max(0.0, age)));
    } catch (const std::exception& e) {
      out.push_back(fmt::format("node {}: cannot read its status: {}", r, e.what()));
    }
  }
  return out;
}

// "value/<key>/<round>/<node>": a round's values never mix with an earlier round's.
// Kept for the health thread to write: the caller (the agent's loop) never waits on the store.
void MultiNodeRendezvous::publishNodeValue(const std::string& key, const std::string& value) {
  std::lock_guard<std::mutex> lock(mu_);
  node_values_[key] = {round_, value};
  ++node_values_version_;
  cv_.notify_all();
}

std::optional<std::string> MultiNodeRendezvous::nodeValue(const std::string& key, int node) {
  auto [me, nodes, round] = position();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (lost_) return std::nullopt;  // each call would wait out the read timeout
  }
  if (node < 0 || node >= nodes) return std::nullopt;
  return kv_->get(fmt::format("value/{}/{}/{}", key, round, node));
}

void MultiNodeRendezvous::setStacksRequestedCallback(StacksRequested requested) {
  std::lock_guard<std::mutex> lock(mu_);
  stacks_requested_ = std::move(requested);
}

// Both run on the agent's loop, which must stay free for what a hang brings with it (a node cut
// off from the store fences itself from that loop: when the request waited there for the
// unreachable store, twice its call timeout, the fence came 27 s after the cut instead of 6 s;
// issue 48's chaos soak). So the health thread makes the store calls; the loop waits at most
// kStacksRequestWait for the request's id and not at all for an answer.
int64_t MultiNodeRendezvous::requestStacks(const std::string& why) {
  auto [me, nodes, round] = position();
  if (nodes <= 1) return 0;
  auto req = std::make_shared<StacksRequest>();
  req->why = why;
  std::unique_lock<std::mutex> lock(mu_);
  if (lost_ || health_stop_ || !health_.joinable()) return 0;
  if (requests_.size() >= kMaxQueuedHealthCalls) {
    log::warn("cannot ask the other nodes for their stacks: {} requests still wait for the store",
              requests_.size());
    return 0;
  }
  requests_.push_back(req);
  stacks_poked_ = true;
  cv_.notify_all();
  if (!cv_.wait_for(lock, kStacksRequestWait, [&] { return req->done || health_stop_; })) {
    req->abandoned = true;
    log::warn("cannot ask the other nodes for their stacks: {} did not answer within {}s",
              storeName(false), kStacksRequestWait.count() / 1000.0);
    return 0;
  }
  if (!req->done) return 0;
  if (!req->error.empty()) {
    log::warn("cannot ask the other nodes for their stacks: {}", req->error);
    return 0;
  }
  return req->id;
}

void MultiNodeRendezvous::answerStacks(int64_t id, const std::string& answer) {
  std::lock_guard<std::mutex> lock(mu_);
  if (answers_.size() >= kMaxQueuedHealthCalls) {
    log::warn("cannot answer request {} for stacks: {} answers still wait for the store", id,
              answers_.size());
    return;
  }
  answers_.emplace_back(id, answer);
  stacks_poked_ = true;
  cv_.notify_all();
}

// On the health thread: the requests and answers the loop handed over (requestStacks,
// answerStacks); a request the loop stopped waiting for is not made.
void MultiNodeRendezvous::sendStacksCalls(int me) {
  std::deque<std::shared_ptr<StacksRequest>> requests;
  std::deque<std::pair<int64_t, std::string>> answers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    requests.swap(requests_);
    answers.swap(answers_);
  }
  for (auto& req : requests) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (req->abandoned) continue;
    }
    int64_t id = 0;
    std::string error;
    try {
      id = kv_->add("stacks/next", 1);
      {
        std::lock_guard<std::mutex> lock(mu_);
        mine_.insert(id);
      }
      kv_->set(fmt::format("stacks/{}", id), req->why);
    } catch (const std::exception& e) {
      error = e.what();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      req->id = id;
      req->error = error;
      req->done = true;
    }
    cv_.notify_all();
  }
  for (const auto& [id, answer] : answers) {
    try {
      kv_->set(fmt::format("stacks/{}/{}", id, me), answer);
    } catch (const std::exception& e) {
      log::warn("cannot answer request {} for stacks: {}", id, e.what());
    }
  }
}

HealthBus::StacksAnswers MultiNodeRendezvous::stacksAnswers(int64_t id) {
  auto [me, nodes, round] = position();
  StacksAnswers out;
  if (id <= 0) return out;
  auto deadline = Clock::now() + kHealthCallTimeout;
  for (int r = 0; r < nodes; ++r) {
    if (r == me) continue;
    try {
      if (Clock::now() <= deadline) {
        if (auto v = kv_->get(fmt::format("stacks/{}/{}", id, r))) {
          out.answers.push_back(*v);
          continue;
        }
      }
    } catch (const std::exception& e) {
      log::debug("stacks of node {}: {}", r, e.what());
    }
    out.missing.push_back(r);
  }
  return out;
}

// Publishes this node's status every few seconds and hands other nodes' requests for stacks
// to the agent: at once where the store pushes them (etcd's watch), within a second where it
// does not. Errors (the service restarting, etcd electing a leader) are retried on the next
// turn: health is best effort, never fatal.
void MultiNodeRendezvous::healthLoop() {
  int64_t next = -1;  // the next request id to look for
  std::unique_ptr<JobKv::Subscription> pushed;
  bool subscribed = false;
  auto published = Clock::time_point{};
  uint64_t values_published = 0;  // node_values_version_ last written
  std::unique_lock<std::mutex> lock(mu_);
  while (!health_stop_) {
    std::string line = status_;
    StacksRequested requested = stacks_requested_;
    int me = rank_;
    int64_t round = round_;
    stacks_poked_ = false;
    if (lost_) {  // each call would wait out the read timeout, and finish() for it
      cv_.wait_for(lock, kStacksPoll, [this] { return health_stop_; });
      continue;
    }
    lock.unlock();
    sendStacksCalls(me);
    bool more = false, failed = false;
    try {
      if (!subscribed) {
        // Before reading where requests stand, so that none falls between the two.
        pushed = kv_->subscribe("stacks/", [this] {
          std::lock_guard<std::mutex> l(mu_);
          stacks_poked_ = true;
          cv_.notify_all();
        });
        subscribed = true;
      }
      if (next < 0) next = kv_->add("stacks/next", 0) + 1;  // earlier requests are over
      auto now = Clock::now();
      std::vector<std::pair<std::string, std::string>> values;
      uint64_t version;
      {
        std::lock_guard<std::mutex> l(mu_);
        version = node_values_version_;
        if (version != values_published)
          for (const auto& [key, v] : node_values_)
            values.emplace_back(fmt::format("value/{}/{}/{}", key, v.first, me), v.second);
      }
      for (const auto& [key, value] : values) kv_->set(key, value);
      values_published = version;  // after they are all set: a failure retries them all
      if (!line.empty() && me >= 0 && now - published >= kStatusEvery) {
        kv_->set(fmt::format("status/{}", me),
                 fmt::format("{}\n{}\n{:.3f}\n{}", round, log::hostname(), unixSeconds(), line));
        published = now;
      }
      if (auto why = kv_->get(fmt::format("stacks/{}", next))) {
        bool own;
        {
          std::lock_guard<std::mutex> l(mu_);
          own = mine_.count(next) > 0;
        }
        if (!own && requested) requested(next, *why);
        ++next;
        more = true;  // another may follow at once
      }
    } catch (const std::exception& e) {
      failed = true;
      log::debug("job health: {}", e.what());
    }
    lock.lock();
    if (!more)
      cv_.wait_for(lock, pushed ? kStatusEvery : kStacksPoll,
                   [this, &values_published, failed] {
                     // New values go out at once; after a failure, on the next turn.
                     return health_stop_ || stacks_poked_ ||
                            (!failed && node_values_version_ != values_published);
                   });
  }
  lock.unlock();
  pushed.reset();
}

}  // namespace ddpl::launcher
