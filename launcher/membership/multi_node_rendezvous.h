#pragma once
// What the two multi-node backends share: GrpcRendezvous
// (launcher/membership/grpc_rendezvous.cc, over the gRPC rendezvous service) and the etcd
// rendezvous (launcher/membership/etcd/etcd_rendezvous.cc). Both run their rounds their own way;
// both need a thread to join on, and the job's health across nodes (status lines, stacks on demand,
// the preflight table), which only needs a few key-value operations. Those are JobKv; each backend
// implements it on its own store, and keeps only its rounds. No gRPC or etcd in this header.
//
// Threading contract (both backends):
// - The agent's event loop calls every method of the roles (rendezvous_handler.h), one at a
//   time, never two at once, except nodeValue(), which any thread may call (node_values.h);
//   main() calls publishPreflight() before the first startRendezvous() (or, when this
//   node's preflight stops it, before stopBeforeJoining() instead). None of them is
//   called from the callbacks below.
// - startRendezvous() returns at once. The join runs on the joiner thread (one at a time: a
//   second start joins the first's thread, which has finished: `done` ran) and blocks there up
//   to the join timeout, plus the read timeout for MASTER_PORT; `done` runs on it, exactly
//   once.
// - RoundEnded runs on the backend's watch thread (gRPC: the round watch's stream; etcd: the
//   round's watch or the keep-alive thread), possibly while the loop is inside another
//   method: the callback must only post to the loop. It never runs for a round before that
//   round's `done` has: a round that ends while its join is still finishing (the watch starts
//   before `done` runs) is reported on the joiner thread right after `done`.
// - StacksRequested runs on the health thread, which starts when the first round forms and
//   stops in finish() (or the destructor). The health thread also publishes this node's
//   status line every few seconds, and makes the store calls of requestStacks() and
//   answerStacks() (the loop waits at most 1 s for a request's id, not at all for an answer);
//   its store calls are bounded by the backend's call timeout and it never throws or ends the
//   job.
// - finish() may come while a join still runs (a signal during the rendezvous): the etcd
//   backend cancels its joiner's wait and waits for it (within a call timeout); the gRPC
//   backend's join ends with its own timeouts.
// - roundStillCurrent(), recordFailure(), jobFailure() and the health reads block for at most
//   a few call timeouts (the etcd backend's roundStillCurrent up to the lease TTL + 2 s: it
//   waits for the other nodes' answers); finish() up to the exit barrier timeout, plus (when
//   hosting the gRPC service) the time the other nodes take to leave, bounded.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "launcher/membership/rendezvous_handler.h"

namespace ddpl::launcher {

// The job-wide keys of the health view, relative to the job's own prefix. Every call is
// bounded (the backend's call timeout) and throws on failure; callers treat failures as
// "not now".
class JobKv {
 public:
  struct Subscription {
    virtual ~Subscription() = default;  // stops it; no callback runs after it returns
  };
  virtual ~JobKv() = default;
  virtual int64_t add(const std::string& key, int64_t delta) = 0;  // returns the new value
  virtual void set(const std::string& key, const std::string& value) = 0;
  virtual std::optional<std::string> get(const std::string& key) = 0;  // none: no such key
  // The same for the job's outcome, which may wait up to the backend's read timeout (a health
  // read gives up sooner).
  virtual std::optional<std::string> getOutcome(const std::string& key) { return get(key); }
  // A list every node appends to and one reader drains (the preflight reports): append()
  // costs each node one write, whatever the number of nodes; readNew() returns what was
  // appended since `cursor` (0: from the start) and moves it on.
  virtual void append(const std::string& list, const std::string& node,
                      const std::string& value) = 0;
  virtual std::vector<std::string> readNew(const std::string& list, int64_t* cursor) = 0;
  // Counts `node` in the tally at `key` and returns how many nodes it holds now. Each node adds
  // itself once.
  virtual int64_t tally(const std::string& key, const std::string& node) = 0;
  // The key's value once it exists, or none after `timeout`.
  virtual std::optional<std::string> waitFor(const std::string& key,
                                             std::chrono::milliseconds timeout) = 0;
  // Calls `changed` (on any thread) soon after a key under `prefix` is written. nullptr: the
  // store cannot push, and the health thread polls instead.
  virtual std::unique_ptr<Subscription> subscribe(const std::string& /*prefix*/,
                                                  std::function<void()> /*changed*/) {
    return nullptr;
  }
};

class MultiNodeRendezvous : public RendezvousHandler {
 public:
  ~MultiNodeRendezvous() override;

  void setRoundEndedCallback(RoundEnded ended) override { ended_ = std::move(ended); }
  void startRendezvous(Done done) override;
  // The same in both backends, over JobKv: counts the failure job-wide (`failures`), keeps
  // the root cause (`last_failure`), ends the round for the nodes still in it (`round/<n>/end`)
  // and leaves it.
  int recordFailure(const std::string& summary) override;
  // The root cause another node published (`last_failure`); once finish() read it, that copy
  // (the last node out clears the key).
  std::string jobFailure() override;

  void publishPreflight(const std::string& report) override;
  void publishStatus(const std::string& line) override;
  std::vector<std::string> otherNodesStatus() override;
  void setStacksRequestedCallback(StacksRequested requested) override;
  int64_t requestStacks(const std::string& why) override;
  void answerStacks(int64_t id, const std::string& answer) override;
  StacksAnswers stacksAnswers(int64_t id) override;
  void publishNodeValue(const std::string& key, const std::string& value) override;
  std::optional<std::string> nodeValue(const std::string& key, int node) override;
  // What markFenced() recorded for `round`.
  std::optional<double> fencedStopWithin(int64_t round) override;
  // Nothing waits for the workers' start here: a hosting agent's service serves before the join.
  void workersStarted() override {}

 protected:
  // `node_id`: this agent's id, unique in the job.
  explicit MultiNodeRendezvous(std::string node_id);
  // From the derived constructor, before anything else is called.
  void setKv(std::unique_ptr<JobKv> kv) { kv_ = std::move(kv); }

  // On the joiner thread: blocks until a round forms (or throws why not).
  virtual std::optional<WorldAssignment> joinOnce() = 0;
  // The round of the last world this node was assigned; none before the first.
  virtual std::optional<int64_t> currentRound() const = 0;
  // The backend's store in messages about losing it ("etcd"); `with_address`: where it is, when
  // that helps.
  virtual std::string storeName(bool with_address) const = 0;
  // recordFailure(), once the failure is counted: leave the round, so that the other nodes
  // learn at once and stop their workers.
  virtual void leaveAfterFailure() = 0;
  // A call to the backend's store failed: on the transport, the store counts as lost from now
  // on (markLost).
  virtual void noteTransport(const std::exception& e) = 0;

  // Before a join: a node that stopped because another failed for good must not wait for a
  // round that will never form. Once the job-wide failure count has passed `max_restarts`,
  // returns the world without a round that tells the supervisor so; none otherwise.
  std::optional<WorldAssignment> failedForGood(const std::string& run_id, int max_restarts);
  // The job-wide count of worker-group failures so far.
  int failureCount();
  // finish(), when this node's workers succeeded: counts this node done in `round`, the last
  // of its `nodes` ending it as "done", and waits up to `timeout` for the round's end: "done",
  // "failed" (a node's workers failed), or none when the others did not finish in time.
  std::optional<std::string> exitBarrier(int64_t round, int nodes,
                                         std::chrono::milliseconds timeout);
  // finish(), on the way out: counts this node gone from `round`; returns how many are.
  int64_t countGone(int64_t round);
  // On the caller's thread before a join starts, once the previous joiner has finished: drop
  // what watched the previous round.
  virtual void beforeJoin() {}

  // A round formed (from joinOnce): its position, for the health thread, which starts now.
  void roundAssigned(int group_rank, int group_world_size, int64_t round);
  // Group rank 0, once its round formed: the nodes' preflight reports not shown yet, as one
  // table in the log.
  void logPreflightTable();
  // finish(): nothing is published for a node on its way out.
  void stopHealth();
  // finish(), when a join may still be running (a signal came during the rendezvous): waits
  // for the joiner thread, which the backend has told to give up.
  void waitForJoiner();
  // The round ended: calls RoundEnded now, or right after `done` if that round's join has
  // not delivered it yet (see the contract above). Any thread.
  void endRound(int64_t round, const std::string& why);
  // The derived destructor, first: its joinOnce() and JobKv must not run after it.
  void stopThreads();
  // This node's group rank, the round's number of nodes and the round; (-1, 0, -1) before the
  // first round.
  std::tuple<int, int, int64_t> position();

  // The backend's store counts as lost once a call failed on the transport (unreachable, or
  // no answer within the read timeout; or the round's watch lost it). Until a join succeeds
  // again, what can wait no longer matters is not tried: the health thread makes no calls,
  // and the calls on the way out (leave, the outcome, the exit barrier) are skipped, so that
  // launch exits about one read timeout after the loss instead of one per call (issue 33:
  // 4x it). Any thread.
  void markLost(const std::string& why);
  // This node fenced itself out of `round` (it could not reach the backend for 2/3 of its
  // window): its workers must be gone within `stop_within` seconds. Any thread.
  void markFenced(int64_t round, double stop_within);
  void clearLost();
  bool lost(std::string* why = nullptr);
  // On the way out: may this call still be made? No once the store is lost or `by` has passed
  // (the calls of finish() share one deadline); says once in the log what was skipped and why.
  bool mayCall(std::chrono::steady_clock::time_point by, const std::string& what);

  RoundEnded ended_;
  // finish(): the job's outcome, read before leaving.
  std::string cached_failure_;

 private:
  void delivered(int64_t round);

  void healthLoop();
  void sendStacksCalls(int me);

  std::string node_id_;
  std::unique_ptr<JobKv> kv_;
  std::thread joiner_;
  std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  std::thread health_;
  bool health_stop_ = false, stacks_poked_ = false;
  int64_t delivered_round_ = -1;                                // the last round whose `done` ran
  std::optional<std::pair<int64_t, std::string>> pending_end_;  // ended before its `done`
  int rank_ = -1, nodes_ = 0;
  int64_t round_ = -1;
  std::string status_;
  // publishNodeValue's values (key -> round, value), set by the health thread when new.
  std::map<std::string, std::pair<int64_t, std::string>> node_values_;
  uint64_t node_values_version_ = 0;  // changes with each publishNodeValue
  StacksRequested stacks_requested_;
  std::set<int64_t> mine_;        // requests this node made: not answered by itself
  // requestStacks and answerStacks hand their store calls to the health thread (each queue at
  // most kMaxQueuedHealthCalls): the loop never waits on the store for them.
  struct StacksRequest {
    std::string why;
    int64_t id = 0;
    std::string error;
    bool done = false, abandoned = false;
  };
  std::deque<std::shared_ptr<StacksRequest>> requests_;
  std::deque<std::pair<int64_t, std::string>> answers_;
  int64_t preflight_cursor_ = 0;  // group rank 0: the preflight reports already in a table
  std::atomic<bool> lost_{false};
  std::string lost_why_;
  bool told_skipping_ = false;
  std::optional<std::pair<int64_t, double>> fenced_;  // the round this node fenced, and the grace
};

}  // namespace ddpl::launcher
