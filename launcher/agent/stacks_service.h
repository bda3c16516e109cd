#pragma once
// Every worker's stack on demand: the control socket that `launch stacks` and `launch status`
// ask through (RUN_DIR/control.sock), the other nodes' requests that come through the
// rendezvous, and this node's own hang. The tools that take the stacks run for up to
// kStackSeconds on the service's own thread; the other nodes' answers are awaited with timers
// of the agent's loop. The loop never waits on either.
//
// Threads: every method on the agent's loop thread. The stacks thread only takes stacks and
// writes their files; its results come back to the loop through EventLoop::post. Every call to
// the health bus stays on the loop thread (the backends' threading contract,
// multi_node_rendezvous.h). Of membership it holds only the bus (health_bus.h): it asks the other
// nodes and answers them, and can neither join, leave nor count a failure.
#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/event_loop.h"
#include "launcher/agent/worker_state.h"
#include "launcher/health/flight_recorder.h"
#include "launcher/health/stacks.h"
#include "launcher/membership/health_bus.h"

namespace ddpl::launcher {

// How long a stack snapshot tool may take per request (all ranks at once).
inline constexpr double kStackSeconds = 10;

// The current attempt, as the stacks service sees it.
struct StacksGroup {
  int attempt = -1;
  std::string attempt_dir;  // RUN_DIR/attempt_<n>: the ranks' folders
  int group_rank = 0;       // this node's rank among nodes
  std::vector<WorkerState> workers;
};

// This node's hang stacks, saved in each rank's folder, and the other nodes' answers.
struct HangStacks {
  int attempt = -1;
  std::vector<std::string> lines;         // "rank R (local rank L, pid P)...: innermost frame"
  std::map<int, StackSummary> summaries;  // by local rank
  std::vector<std::string> remote;        // each other node's answer, or why there is none
  std::string text;                       // every rank's whole stack (cut), for the dashboard
  std::map<int, FlightRecord> recorders;  // by local rank: what each rank's recorder said
};

class StacksService {
 public:
  struct Config {
    std::string run_dir;
    std::string host;
    bool python = false;      // the workers run Python: py-spy
    std::string interpreter;  // where py-spy is looked for first (a venv's bin/), when python
    std::string path_env;     // the workers' PATH, where the tools are looked for
    // This node's line of the `launch status` reply: "node N (host): <live view>".
    std::function<std::string()> status_line;
    // The soonest a group can be found hung (HangOptions::soonestLimitSec; 0: never): how
    // soon after this
    // node's own hang another node's hang request may still be about it, though this node's
    // group restarted since.
    double hang_timeout_sec = 0;
  };
  StacksService(Config config, EventLoop& loop, HealthBus& bus);
  ~StacksService();  // waits for the stacks thread; removes the control socket
  StacksService(const StacksService&) = delete;
  StacksService& operator=(const StacksService&) = delete;

  // RUN_DIR/control.sock, watched by the loop; without it (a path too long) `launch stacks`
  // is not available for the run.
  void openControlSocket();
  // The loop's descriptors that are the service's, and their events.
  bool owns(uint64_t tag) const;
  void onEvent(uint64_t tag);

  // What runs now: at every start of a group and every exit of a worker.
  void setGroup(StacksGroup group);
  // Every running rank's stack now, as `launch stacks` takes them (the other nodes save theirs
  // too): `done` gets their text on the loop thread (the dashboard's "capture stacks").
  void takeSnapshot(std::function<void(std::string)> done);
  // Another node asked (a hang there, or `launch stacks` on it).
  void onRemoteRequest(int64_t id, std::string why);
  // This node found a hang: asks the other nodes (`why` is what they are told) and saves every
  // running rank's stack in its folder. `saved` gets them once saved, `done` (the other nodes'
  // answers added) once those have come or kStackSeconds + 5 s have passed; both on the loop
  // thread.
  void takeHangStacks(const std::string& why, std::function<void(const HangStacks&)> saved,
                      std::function<void(HangStacks)> done);

  // The files and folders of stacks saved so far (kept when the run's folder is removed).
  std::vector<std::string> evidence() const;
  // The run is ending: waits for the stacks thread, answers what is waiting with what there is
  // and stops watching the control socket.
  void shutdown();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddpl::launcher
