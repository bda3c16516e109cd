#pragma once
#include <string>

#include "common/net.h"  // isLoopback

namespace ddpl::launcher {

// Binds port 0 on `addr` and returns the port the kernel chose (then closes it, so rank 0 can
// bind it). Throws ddpl::NetworkError naming the address when it cannot.
int pickFreePort(const std::string& addr);

// Throws ddpl::NetworkError naming addr:port when the port cannot be bound (already in use).
void checkPortFree(const std::string& addr, int port);

// Group rank 0's MASTER_PORT: a free port on the address its workers' store binds, loopback
// when the master address is (a job on one machine), else `local_addr` or every interface.
int pickMasterPort(const std::string& master_addr, const std::string& local_addr);

// The local address used to reach host:port (no packet is sent: a UDP connect picks the route).
std::string routeAddressTo(const std::string& host, int port);

}  // namespace ddpl::launcher
