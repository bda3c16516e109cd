#include <fmt/format.h>

#include <optional>

#include "common/parse.h"
#include "launcher/cli/cli.h"
#include "launcher/cli/values.h"

namespace ddpl::launcher {
using cli::parseSeconds;
using cli::split;
using cli::trim;

namespace {

// The keys only the etcd backend reads: torchrun's (protocol, cacert, cert, key, etcd_prefix),
// the spellings its c10d backend uses for the same files, and ours. Their values are the etcd
// backend's to check (launcher/membership/etcd/etcd_config.h).
const char* const kEtcdKeys[] = {"protocol",    "cacert",        "cert",      "key",
                                 "etcd_prefix", "ca_cert",       "ssl_cert",  "ssl_cert_key",
                                 "user",        "password_file", "lease_ttl", "connect_timeout"};

bool isEtcdConfKey(const std::string& key) {
  for (const char* k : kEtcdKeys)
    if (key == k) return true;
  return false;
}

}  // namespace

RdzvConf parseRdzvConf(const std::string& v, std::vector<std::string>* warnings) {
  RdzvConf c;
  auto warn = [&](std::string line) {
    if (warnings) warnings->push_back(std::move(line));
  };
  std::optional<double> keep_alive_interval, keep_alive_attempts;
  if (trim(v).empty()) return c;
  for (const auto& kv : split(v, ',')) {
    auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
      throw UsageError(fmt::format("--rdzv-conf: '{}' is not key=value", kv));
    std::string key = trim(kv.substr(0, eq)), value = trim(kv.substr(eq + 1));
    std::string flag = "--rdzv-conf " + key;
    if (key == "join_timeout" || key == "timeout")
      c.join_timeout_sec = parseSeconds(flag, value);
    else if (key == "last_call_timeout")
      c.last_call_timeout_sec = parseSeconds(flag, value);
    else if (key == "read_timeout")
      c.read_timeout_sec = parseSeconds(flag, value);
    else if (key == "heartbeat_timeout")
      c.heartbeat_timeout_sec = parseSeconds(flag, value);
    else if (key == "exit_barrier_timeout" || key == "close_timeout")
      c.exit_barrier_timeout_sec = parseSeconds(flag, value);
    else if (key == "is_host")
      c.is_host = parseBool(flag, value);
    else if (key == "agent_store")
      c.agent_store = parseBool(flag, value);
    else if (key == "token_file")
      c.token_file = value;
    else if (key == "tls_ca_file")
      c.tls_ca_file = value;
    // torchrun declares a node dead after keep_alive_interval x keep_alive_max_attempt seconds:
    // our hosting agent's heartbeat window means the same.
    else if (key == "keep_alive_interval")
      keep_alive_interval = parseNumber(flag, value, 0.001, 1e6);
    else if (key == "keep_alive_max_attempt")
      keep_alive_attempts = parseNumber(flag, value, 1, 1e6);
    else if (key == "store_type" || key == "use_libuv")
      warn(
          fmt::format("--rdzv-conf {}={}: has no effect here (the job's store is launch's "
                      "own server, which speaks torch's TCPStore protocol to workers)",
                      key, value));
    else if (isEtcdConfKey(key))
      c.etcd[key] = value;  // checked by the etcd backend; ignored (with a warning) by the others
    else
      warn(fmt::format(
          "--rdzv-conf: unknown key '{}' ignored (known: join_timeout or timeout, "
          "last_call_timeout, read_timeout, close_timeout or exit_barrier_timeout, "
          "heartbeat_timeout, keep_alive_interval, keep_alive_max_attempt, is_host, agent_store, "
          "token_file, tls_ca_file)",
          key));
  }
  if (keep_alive_interval || keep_alive_attempts)
    c.heartbeat_timeout_sec = keep_alive_interval.value_or(5) * keep_alive_attempts.value_or(3);
  if (c.join_timeout_sec <= 0 || c.read_timeout_sec <= 0 || c.heartbeat_timeout_sec <= 0)
    throw UsageError("--rdzv-conf: join_timeout, read_timeout and heartbeat_timeout must be > 0");
  return c;
}

}  // namespace ddpl::launcher
