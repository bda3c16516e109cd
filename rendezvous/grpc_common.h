#pragma once
// Internal to the gRPC layer: included only by its .cc files, never by a public header.
#include <grpcpp/grpcpp.h>

#include <string>

#include "rendezvous/store.h"

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

std::shared_ptr<grpc::Channel> makeChannel(const ChannelSpec& spec);

// Sets the deadline and the token on a call.
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

}  // namespace ddpl::rdzv::grpc_detail
