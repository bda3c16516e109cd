#pragma once
#include <optional>

#include "launcher/embedded_store.h"
#include "launcher/rendezvous_handler.h"

namespace ddpl::launcher {

// Single node: every rank is local; rank 0 hosts Python's TCPStore on MASTER_PORT, a free port
// picked per attempt unless the user fixed one (then it must be free, or we say who holds it).
class LocalRendezvous : public RendezvousHandler {
 public:
  // `store`, when given, is started for the first attempt and its endpoint handed to workers.
  LocalRendezvous(std::string run_id, int local_world_size, std::string master_addr,
                  std::optional<int> master_port, EmbeddedStore* store = nullptr);
  void startRendezvous(Done done) override;
  void setRoundEndedCallback(RoundEnded) override {}  // one node: rounds never end under us
  int recordFailure(const std::string&) override { return ++failures_; }
  std::string jobFailure() override { return ""; }
  bool finish(bool) override { return true; }
  std::string describe() const override;

  // The world of the next attempt, synchronously (what startRendezvous reports).
  WorldAssignment nextWorld();

 private:
  std::string run_id_;
  int local_world_size_;
  std::string master_addr_;
  std::optional<int> master_port_;
  EmbeddedStore* store_;
  int failures_ = 0;
  int64_t round_ = 0;
};

// Binds port 0 on `addr` and returns the port the kernel chose (then closes it, so rank 0 can
// bind it). Throws ddpl::NetworkError naming the address when it cannot.
int pickFreePort(const std::string& addr);

// Throws ddpl::NetworkError naming addr:port when the port cannot be bound (already in use).
void checkPortFree(const std::string& addr, int port);

}  // namespace ddpl::launcher
