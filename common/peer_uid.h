#pragma once
// Which local user holds the other end of a connection: for TCP, the kernel's socket
// diagnostics (NETLINK_SOCK_DIAG, one exact lookup of the client's socket by its 4-tuple); for a
// Unix socket, SO_PEERCRED. A loopback address says only that the peer is on this machine, not
// whose it is: the servers that serve one node's job without a token (the agent store's torch
// protocol, the dashboard's page) ask this instead. Used by rendezvous/ and launcher/.
#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace ddpl {

struct PeerUid {
  std::optional<uint32_t> uid;  // set: the owner of the peer's socket
  std::string why;              // unset: why not, naming the addresses
};

// The kernel answers in microseconds; this bounds a lookup on a host too loaded to.
inline constexpr std::chrono::milliseconds kPeerUidTimeout{500};

// The owner of the client's socket of the TCP connection from `peer` to `local` (the server's
// end as getsockname gives it, the client's as getpeername does; IPv4, IPv6 and IPv4-mapped
// IPv6). No uid when that socket is not in this host's network namespace (a remote peer),
// has no owner any more (TIME_WAIT: the client closed it), or the kernel refused or did not
// answer within `timeout`: callers that gate on it refuse then (fail closed).
PeerUid tcpPeerUid(const sockaddr_storage& local, const sockaddr_storage& peer,
                   std::chrono::milliseconds timeout = kPeerUidTimeout);

// The same for a connected socket, TCP (as above) or Unix (its peer's credentials).
PeerUid peerUidOf(int fd, std::chrono::milliseconds timeout = kPeerUidTimeout);

}  // namespace ddpl
