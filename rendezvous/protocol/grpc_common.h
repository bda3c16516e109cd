#pragma once
// Internal to the gRPC layer: included only by its .cc files, never by a public header.
#include <grpcpp/grpcpp.h>

#include <string>

#include "rendezvous/store/store.h"

namespace ddpl::rdzv::grpc_detail {

// Metadata key carrying the shared token on every call.
inline constexpr char kTokenHeader[] = "x-ddpl-token";

// Room for the rest of a request around its largest value.
inline constexpr int64_t kMessageOverheadBytes = 1 << 20;

struct ChannelSpec {
  std::string endpoint;
  std::string tls_ca_file;  // empty: plaintext
  std::string tls_cert_file, tls_key_file;
  int64_t max_value_bytes = 0;
};

// Sends gRPC's internal log lines through common/log.h instead of straight to stderr.
void routeGrpcLogs();

std::string readFile(const std::string& path, const char* what);

// Throws InvalidArgument for a spec no channel can be made of (no endpoint, a client
// certificate without TLS, a certificate without its key). makeChannel checks it too.
void checkChannelSpec(const ChannelSpec& spec);

std::shared_ptr<grpc::Channel> makeChannel(const ChannelSpec& spec);

// Longest deadline a client sets: larger timeouts (up to INT64_MAX ms from a caller) mean
// "wait very long" and are cut to this instead of wrapping into the past.
inline constexpr Duration kMaxClientTimeout{std::chrono::hours(24 * 365 * 10)};

// a + b, both clamped to 0..kMaxClientTimeout, without overflow.
Duration saturatingAdd(Duration a, Duration b);

// Sets the deadline (timeout clamped as saturatingAdd does) and the token on a call.
void prepare(grpc::ClientContext& ctx, const std::string& token, Duration timeout);

// Throws the ddpl exception for a failed call: DEADLINE_EXCEEDED -> TimeoutError,
// UNAVAILABLE -> NetworkError, UNAUTHENTICATED -> AuthError, INVALID_ARGUMENT ->
// InvalidArgument, everything else -> StoreError. The message keeps the server's words and
// adds the endpoint and the operation.
[[noreturn]] void throwStatus(const grpc::Status& status, const std::string& endpoint,
                              const std::string& op);

const char* codeName(grpc::StatusCode code);

std::string describe(Duration d);

// Calls `attempt` until it returns OK, with jittered exponential backoff, for at most
// `timeout`. UNAUTHENTICATED and INVALID_ARGUMENT are final. Throws NetworkError naming the
// endpoint, the time spent and the attempts.
void retryConnect(const std::string& endpoint, Duration timeout,
                  const std::function<grpc::Status(Duration attempt_timeout)>& attempt);

// Runs `call` again, with jittered exponential backoff, while it fails UNAVAILABLE (the
// server cannot be reached), for at most `window` counted from its first such failure: a
// restarted server gets that long to come back. Returns the last status.
grpc::Status retryWhileUnavailable(Duration window, const std::function<grpc::Status()>& call);

}  // namespace ddpl::rdzv::grpc_detail
