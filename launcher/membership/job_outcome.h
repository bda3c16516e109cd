#pragma once
// The job's outcome, one of the roles a rendezvous backend plays (rendezvous_handler.h): the
// job-wide failure count that restarts are counted against, the root cause another node
// found, and the end of the run (the exit barrier). Only the agent holds it. One node keeps
// its own count (LocalRendezvous); several nodes share it through the job's store
// (MultiNodeRendezvous, which writes that protocol once for both backends).
#include <string>

namespace ddpl::launcher {

class JobOutcome {
 public:
  virtual ~JobOutcome() = default;

  // Publishes that this node's worker group failed (`summary`: the root cause, for the other
  // nodes' reports) and returns the job-wide failure count including this one. Bounded.
  virtual int recordFailure(const std::string& summary) = 0;

  // The root cause another node published, when the job failed there; "" if none.
  virtual std::string jobFailure() = 0;

  // The launcher is done. success: this node's workers all succeeded; waits (bounded by the
  // close timeout) for the other nodes to finish too, so that leaving doesn't end their round.
  // Returns false when the job failed elsewhere meanwhile. Always leaves the rendezvous.
  virtual bool finish(bool success) = 0;
};

}  // namespace ddpl::launcher
