#pragma once
// The Store every worker and agent uses: a client of the rendezvous server's Store service.
// No gRPC or protobuf in this header; the channel lives behind connectGrpcStore().
#include <memory>
#include <string>

#include "rendezvous/store/store.h"

namespace ddpl::rdzv {

// Largest value a server accepts unless configured otherwise. The client learns the
// server's actual limit when it connects and refuses larger values before sending them.
inline constexpr int64_t kDefaultMaxValueBytes = 16 << 20;
inline constexpr Duration kDefaultConnectTimeout{std::chrono::seconds(30)};

struct GrpcStoreOptions {
  std::string endpoint;                     // host:port
  std::string token;                        // empty: none
  std::string tls_ca_file;                  // empty: plaintext
  std::string tls_cert_file, tls_key_file;  // optional client certificate
  std::string prefix;  // key prefix, e.g. "run/attempt_0/"; numKeys() counts only these
  Duration connect_timeout = kDefaultConnectTimeout;
  // Deadline of the calls that do not block on other ranks (set, add, check, ...). get, wait
  // and multiGet take their own timeouts; their deadline adds a short grace on top, so that
  // the server's message (which key, how long) arrives before the transport gives up.
  Duration default_timeout = kDefaultStoreTimeout;
  // Every operation on one long-lived Session stream (several times cheaper than a unary call
  // each). Off: one unary call per operation, which is also what happens with a server that
  // has no Session.
  bool use_session = true;
  // set and multiSet on the Session stream return once the request is queued, without waiting
  // for the server, as TCPStore's set does: the server answers them only when they fail, and
  // handles a stream's requests in order, so every later operation of this store already sees
  // the value. A set the server refused, or one a broken stream may have lost, makes the first
  // operation of this store that starts after the store learnt it throw (naming the key and
  // the server's reason; the operation itself is not sent), and the destructor
  // waits (up to 10 s) for the server to confirm the sets still unconfirmed. At most
  // kMaxQuietSets go unconfirmed; past that a set waits for its answer. Off: every set waits.
  bool quiet_sets = true;
  // Carry the Session's operations on the server's plain store socket (same port, no gRPC:
  // docs/rendezvous.md, "The store's socket transport") instead of a gRPC stream: a round
  // trip costs a few system calls instead of gRPC's thread hand-offs. Only without TLS; a
  // server without the socket is detected when connecting and gRPC is used.
  bool socket = true;
};

// Sets a store lets go unconfirmed before the next one waits for its answer (quiet_sets).
inline constexpr int kMaxQuietSets = 1024;

// Connects with bounded retry and jittered backoff: throws ddpl::NetworkError naming the
// endpoint after connect_timeout, ddpl::AuthError at once for a wrong or missing token.
// The store is safe to call from several threads at once. When its Session stream breaks
// (server restart, dropped connection), the operations waiting on it fail with a NetworkError
// naming the endpoint, and the next operation opens a new stream, retrying for up to
// connect_timeout (bounded by the operation's own deadline) so that a restarted server has
// that long to come back.
std::unique_ptr<Store> connectGrpcStore(const GrpcStoreOptions& options);

}  // namespace ddpl::rdzv
