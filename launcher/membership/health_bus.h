#pragma once
// The job's health across nodes (issue 18), one of the roles a rendezvous backend plays
// (rendezvous_handler.h): each node's status line, and every node's stacks on demand. The live
// view publishes and the stacks service (`launch status`, `launch stacks`, a hang's stacks)
// asks and answers (the agent sets the callback that posts the other nodes' requests to its
// loop); neither part needs the rest of membership, so each holds this role only (and a test
// gives them a fake of it). One node has nobody to tell or ask: LocalRendezvous's bus
// does nothing, which is the truth there, so that its callers never test for a bus.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ddpl::launcher {

class HealthBus {
 public:
  using StacksRequested = std::function<void(int64_t id, std::string why)>;
  struct StacksAnswers {
    std::vector<std::string> answers;
    std::vector<int> missing;  // group ranks of the nodes that have not answered yet
  };

  virtual ~HealthBus() = default;

  // This node's status (a line of the live view), for the other nodes and the user. Returns
  // at once; a background thread publishes the latest one every few seconds.
  virtual void publishStatus(const std::string& line) = 0;
  // The latest status of every other node of the round: "node N (host): <line>, Ts ago".
  // Bounded (a few seconds at most).
  virtual std::vector<std::string> otherNodesStatus() = 0;

  // Stacks on every node. requestStacks() asks every other node to save its workers' stacks
  // now and returns the request's id (0: no other node); each node's agent hears of it
  // through the callback (on any thread), saves, and answers with answerStacks();
  // stacksAnswers() returns the answers there are now and the nodes yet to answer (it does not
  // wait: the caller answers other nodes' requests meanwhile, which may come at the same
  // moment). All bounded.
  virtual void setStacksRequestedCallback(StacksRequested requested) = 0;
  virtual int64_t requestStacks(const std::string& why) = 0;
  virtual void answerStacks(int64_t id, const std::string& answer) = 0;
  virtual StacksAnswers stacksAnswers(int64_t id) = 0;
};

}  // namespace ddpl::launcher
