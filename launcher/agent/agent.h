#pragma once
// The local agent: carries out the supervisor's decisions with real processes. A small loop
// (common/event_loop.h) over a signalfd (SIGCHLD and the handled signals), the workers' output
// pipes and the control socket, with timers for the shutdown grace period, the monitor tick
// (--monitor-interval: heartbeats, the live view, hang detection) and, without a cgroup, the
// scan for orphaned descendants. The loop dispatches; its parts decide: the workers' heartbeat
// channels (health/heartbeat_channel.h), the live view and metrics (live_view.h), the hang watch
// and responder (hang_responder.h), the stacks service (stacks_service.h), the warm workers
// (warm_workers.h), the checkpoint keeper (checkpoint/checkpoint_keeper.h), the run's leftovers
// (containment.h) and the end-of-run summary (run_summary.h).
//
// Threading contract:
// - The loop thread (the one that calls run()) owns the supervisor, the workers' records, the
//   output router, the parts above and every call to the rendezvous backend's roles. The parts are
//   handed copies of what they need (WorkerState, the attempt's folder) and tell the loop what
//   happened (the hang responder returns the failures to record); none acts on the loop's state.
// - The stacks thread (StacksService's own, started at the first request) runs the stack tools
//   (up to kStackSeconds) and writes their files; its results come back through the loop's
//   eventfd (EventLoop::post). The other nodes' answers are awaited with the loop's timers: the
//   loop never blocks on stacks.
// - The rendezvous's threads (joiner, watch, health: multi_node_rendezvous.h) only post to the
//   loop: the world found, the round ended, another node's request for stacks.
// - The checkpoint tier's persister thread ("ckpt-persister", started at the first checkpoint)
//   copies to disk and sends replicas; it reads the successor's endpoint from the job's store
//   itself (NodeValues::nodeValue, which any thread may call).
// - after_start hooks and the metrics endpoint's updates run on the loop thread (the endpoint
//   serves scrapes on threads of its own).
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "launcher/agent/numa.h"
#include "launcher/agent/worker_spec.h"
#include "launcher/cli/options.h"
#include "launcher/membership/rendezvous_handler.h"

namespace ddpl::launcher {

struct AgentConfig {
  LaunchOptions options;
  int nproc = 1;
  std::vector<std::string> command;  // resolved, before ${local_rank} substitution
  Environment base_env;              // the launcher's environment, inherited by workers
  Environment extra_env;             // added for every worker (store endpoint, ...)
  std::string run_id;
  std::string host;
  std::vector<NumaPlacement> numa;  // per local rank (--numa-binding); empty: no binding
  std::string python_origin;        // "/path/python3 (why)" when PROGRAM runs under Python
  // Each called once, on the agent's thread, when the job has run that many seconds since its
  // first group started (0: right after that group's workers are exec'ed): work that must not
  // delay or compete with the workers' start (single-node preflight, the run manifest and its
  // probe).
  std::vector<std::pair<double, std::function<void()>>> after_start;
};

class Agent {
 public:
  // `rendezvous`: the backend, every role of it (rendezvous_handler.h). The agent alone uses
  // membership and the job's outcome; it hands each part the one role that part uses (the
  // live view the health bus and node values, the stacks service the bus, the checkpoint keeper
  // the node values).
  Agent(AgentConfig config, RendezvousHandler& rendezvous);
  ~Agent();
  // Runs the job to the end and returns the launcher's exit code. The caller must have blocked
  // SIGCHLD and the handled signals in every thread (blockSignals) before any thread started.
  int run();

  // The directory holding attempt_<n>/<local_rank>/ for this run.
  const std::string& runLogDir() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// `launch stacks RUN_DIR` / `launch status RUN_DIR`: asks the launch running that directory's
// job (its control socket) for a snapshot of every worker's stack on every node (the job keeps
// running; prints where each went and each rank's innermost frame), or for the status of every
// node. Returns the exit code: 0, or 1 with a message when no launch answers there.
int controlRequest(const std::string& run_dir, const std::string& what);

// Blocks SIGCHLD, SIGPIPE-as-ignored, and `signals` so that the agent receives them through a
// signalfd. Call first thing in main, before starting any thread.
void blockSignals(const std::vector<int>& signals);

}  // namespace ddpl::launcher
