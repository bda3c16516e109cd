#pragma once
// A small value per node and round, through the job's store: one of the roles a rendezvous
// backend plays (rendezvous_handler.h). The checkpoint keeper publishes its replica server's
// endpoint and finds its successor's (issue 29); the live view shares its rows for the
// dashboard. Neither needs the rest of membership, so each holds this role only. One node has
// no other node: LocalRendezvous publishes nothing and finds nothing.
//
// Threads: unlike the other roles, nodeValue() is also called off the agent's loop thread (the
// checkpoint tier's persister, the live view's reader of the other nodes' rows): backends make
// it safe from any thread.
#include <optional>
#include <string>

namespace ddpl::launcher {

class NodeValues {
 public:
  virtual ~NodeValues() = default;

  // This node's `value` under `key` for the current round. Returns at once; the backend's
  // health thread writes it.
  virtual void publishNodeValue(const std::string& key, const std::string& value) = 0;
  // What node `node` (its group rank) published under `key` in the current round; none when
  // it published nothing, or the store cannot be read now. Bounded (a few seconds at most).
  virtual std::optional<std::string> nodeValue(const std::string& key, int node) = 0;
};

}  // namespace ddpl::launcher
