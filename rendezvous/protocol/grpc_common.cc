#include "rendezvous/protocol/grpc_common.h"

#include <absl/synchronization/mutex.h>
#include <fmt/format.h>
#include <google/protobuf/stubs/logging.h>
#include <grpc/support/log.h>

#include <algorithm>
#include <fstream>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include "common/errors.h"
#include "common/log.h"

namespace ddpl::rdzv::grpc_detail {

std::string readFile(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InvalidArgument(fmt::format("cannot read {} file {}", what, path));
  std::ostringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  if (s.empty()) throw InvalidArgument(fmt::format("{} file {} is empty", what, path));
  return s;
}

namespace {

void logFromGrpc(gpr_log_func_args* args) {
  // gRPC's own errors are mostly about one peer (a failed TLS handshake, garbage on the
  // port); they matter to an operator but must not look like the server failing.
  switch (args->severity) {
    case GPR_LOG_SEVERITY_ERROR:
      log::warn("grpc: {}", args->message);
      break;
    case GPR_LOG_SEVERITY_INFO:
      log::debug("grpc: {}", args->message);
      break;
    default:
      log::trace("grpc: {}", args->message);
  }
}

// protobuf logs a line for every message it cannot parse (a string field that is not UTF-8,
// for instance): what any peer, with or without the token, can send as often as it likes.
// Those lines go through the log at most once per kProtobufLogInterval, with the count of
// those held back.
constexpr auto kProtobufLogInterval = std::chrono::seconds(10);

void logFromProtobuf(google::protobuf::LogLevel level, const char* file, int line,
                     const std::string& message) {
  if (level == google::protobuf::LOGLEVEL_FATAL) {
    log::error("protobuf {}:{}: {}", file, line, message);
    return;
  }
  static auto* limiter = new log::Limiter(kProtobufLogInterval);  // never freed: threads at exit
  int64_t before = 0;
  if (!limiter->admit(&before)) return;
  if (before > 0)
    log::warn("protobuf: {} more message(s) in the last {}s were not logged; the latest:", before,
              std::chrono::duration_cast<std::chrono::seconds>(kProtobufLogInterval).count());
  log::warn("protobuf: {}", message);
}

}  // namespace

void routeGrpcLogs() {
  static std::once_flag once;
  std::call_once(once, [] {
    gpr_set_log_function(logFromGrpc);
    google::protobuf::SetLogHandler(logFromProtobuf);
    // Debian's Abseil is built without NDEBUG, so every absl::Mutex gRPC takes feeds a global
    // lock-order graph (deadlock detection, a debugging aid): 5-8% of the store's CPU at 64
    // clients, all of it under one global spin lock. Release builds of Abseil skip it.
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  });
}

void checkChannelSpec(const ChannelSpec& spec) {
  if (spec.endpoint.empty()) throw InvalidArgument("rendezvous endpoint is empty (want host:port)");
  if (spec.tls_ca_file.empty() && !spec.tls_cert_file.empty())
    throw InvalidArgument("a client certificate needs TLS: set the CA file as well");
  if (!spec.tls_ca_file.empty() && spec.tls_cert_file.empty() != spec.tls_key_file.empty())
    throw InvalidArgument("client certificate and key go together: set both or neither");
}

std::shared_ptr<grpc::Channel> makeChannel(const ChannelSpec& spec) {
  routeGrpcLogs();
  checkChannelSpec(spec);
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (spec.tls_ca_file.empty()) {
    creds = grpc::InsecureChannelCredentials();
  } else {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = readFile(spec.tls_ca_file, "TLS CA");
    if (!spec.tls_cert_file.empty()) {
      o.pem_cert_chain = readFile(spec.tls_cert_file, "TLS certificate");
      o.pem_private_key = readFile(spec.tls_key_file, "TLS key");
    }
    creds = grpc::SslCredentials(o);
  }
  grpc::ChannelArguments args;
  // gRPC's own reconnect backoff grows to two minutes; ours is bounded by connect_timeout,
  // so keep the channel's short enough not to sit out our whole budget.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  // Not a backoff: gRPC gives each connection attempt (TCP and HTTP/2 handshakes) this long at
  // least. At 100 ms, 64 agents starting at once on a busy machine had some attempts cut
  // before etcd answered, every retry too, and the agent failed to connect (issue 14).
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 10000);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // Our calls are not retried by gRPC (retryConnect does its own, bounded): without the
  // retry filter every call skips its bookkeeping and send-message copies.
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  // Per-call statistics for channelz, which nothing here serves.
  args.SetInt(GRPC_ARG_ENABLE_CHANNELZ, 0);
  // Heartbeats (the fence) and call deadlines find a lost server; a ping unanswered for 10 s
  // would close the connection on a link that merely dropped packets for a while, and the
  // server would then see the node's watch break (docs/network-faults.md).
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 20000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 60000);
  int64_t limit = std::max<int64_t>(spec.max_value_bytes, 1) * 4 + kMessageOverheadBytes;
  args.SetMaxReceiveMessageSize(static_cast<int>(std::min<int64_t>(limit, INT32_MAX)));
  args.SetMaxSendMessageSize(
      static_cast<int>(std::min<int64_t>(spec.max_value_bytes + kMessageOverheadBytes, INT32_MAX)));
  return grpc::CreateCustomChannel(spec.endpoint, creds, args);
}

Duration saturatingAdd(Duration a, Duration b) {
  auto clamp = [](Duration d) { return std::clamp(d, Duration::zero(), kMaxClientTimeout); };
  return clamp(clamp(a) + clamp(b));  // two clamped values cannot overflow int64 ms
}

void prepare(grpc::ClientContext& ctx, const std::string& token, Duration timeout) {
  ctx.set_deadline(std::chrono::system_clock::now() + saturatingAdd(timeout, Duration::zero()));
  if (!token.empty()) ctx.AddMetadata(kTokenHeader, token);
}

const char* codeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::OK:
      return "OK";
    case grpc::CANCELLED:
      return "CANCELLED";
    case grpc::UNKNOWN:
      return "UNKNOWN";
    case grpc::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case grpc::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    case grpc::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::ABORTED:
      return "ABORTED";
    case grpc::OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case grpc::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case grpc::INTERNAL:
      return "INTERNAL";
    case grpc::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::DATA_LOSS:
      return "DATA_LOSS";
    default:
      return "UNKNOWN";
  }
}

std::string describe(Duration d) {
  if (d.count() % 1000 == 0) return fmt::format("{}s", d.count() / 1000);
  if (d.count() < 1000) return fmt::format("{}ms", d.count());
  return fmt::format("{:.3g}s", d.count() / 1000.0);
}

void throwStatus(const grpc::Status& status, const std::string& endpoint, const std::string& op) {
  std::string msg = fmt::format("{} on rendezvous server {}: {}: {}", op, endpoint,
                                codeName(status.error_code()), status.error_message());
  switch (status.error_code()) {
    case grpc::DEADLINE_EXCEEDED:
      throw TimeoutError(msg);
    case grpc::UNAVAILABLE:
      throw NetworkError(msg);
    case grpc::UNAUTHENTICATED:
    case grpc::PERMISSION_DENIED:
      throw AuthError(msg);
    case grpc::INVALID_ARGUMENT:
      throw InvalidArgument(msg);
    default:
      throw StoreError(msg);
  }
}

namespace {
// Seeds the backoff jitter: different per thread and process (agents started together must
// not retry in lockstep), without a random_device per call (1,024 ranks connecting at once).
uint32_t jitterSeed() {
  static const uint32_t base = std::random_device{}();
  return base ^ static_cast<uint32_t>(std::hash<std::thread::id>{}(std::this_thread::get_id())) ^
         static_cast<uint32_t>(Clock::now().time_since_epoch().count());
}
}  // namespace

grpc::Status retryWhileUnavailable(Duration window, const std::function<grpc::Status()>& call) {
  std::minstd_rand rng(jitterSeed());
  Duration backoff{100};
  std::optional<Clock::time_point> lost;
  for (;;) {
    grpc::Status s = call();
    if (s.error_code() != grpc::UNAVAILABLE) return s;
    auto now = Clock::now();
    if (!lost) lost = now;
    auto left = std::chrono::ceil<Duration>(*lost + window - now);
    if (left.count() <= 0)
      return grpc::Status(s.error_code(), fmt::format("{} (unreachable for {}, the read timeout)",
                                                      s.error_message(), describe(window)));
    std::uniform_int_distribution<int64_t> jitter(backoff.count() / 2, backoff.count());
    std::this_thread::sleep_for(std::min(Duration(jitter(rng)), left));
    backoff = std::min(backoff * 2, Duration(std::chrono::seconds(2)));
  }
}

void retryConnect(const std::string& endpoint, Duration timeout,
                  const std::function<grpc::Status(Duration)>& attempt) {
  auto start = Clock::now();
  auto deadline = start + timeout;
  std::minstd_rand rng(jitterSeed());
  Duration backoff{50};
  grpc::Status last;
  int attempts = 0;
  for (;;) {
    auto left = std::chrono::ceil<Duration>(deadline - Clock::now());
    if (left.count() <= 0) break;
    ++attempts;
    last = attempt(std::min(left, Duration(std::chrono::seconds(5))));
    if (last.ok()) return;
    if (last.error_code() == grpc::UNAUTHENTICATED ||
        last.error_code() == grpc::PERMISSION_DENIED || last.error_code() == grpc::INVALID_ARGUMENT)
      throwStatus(last, endpoint, "connect");
    // Full jitter: agents of a big job started together must not retry in lockstep.
    std::uniform_int_distribution<int64_t> jitter(backoff.count() / 2, backoff.count());
    Duration pause{jitter(rng)};
    left = std::chrono::ceil<Duration>(deadline - Clock::now());
    if (left.count() <= 0) break;
    std::this_thread::sleep_for(std::min(pause, left));
    backoff = std::min(backoff * 2, Duration(std::chrono::seconds(2)));
  }
  auto spent = std::chrono::duration_cast<Duration>(Clock::now() - start);
  throw NetworkError(fmt::format(
      "cannot reach rendezvous server {} after {} ({} attempts, connect timeout {}): {}: {}",
      endpoint, describe(spent), attempts, describe(timeout), codeName(last.error_code()),
      last.error_message()));
}

}  // namespace ddpl::rdzv::grpc_detail
