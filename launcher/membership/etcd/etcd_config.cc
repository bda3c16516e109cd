#include "launcher/membership/etcd/etcd_config.h"

#include <fmt/format.h>

#include "common/defaults.h"
#include "common/errors.h"
#include "common/parse.h"
#include "rendezvous/store/token.h"

namespace ddpl::launcher {
namespace {

constexpr int kEtcdDefaultPort = 2379;

}  // namespace

EtcdRendezvousConfig etcdRendezvousConfig(const LaunchOptions& o, const RoundsConfig& rounds,
                                          const Environment& env) {
  EtcdRendezvousConfig c;
  c.rounds = rounds;
  const auto& conf = o.rdzv_conf.etcd;
  auto get = [&](std::initializer_list<const char*> names) -> std::string {
    for (const char* n : names)
      if (auto it = conf.find(n); it != conf.end()) return it->second;
    return "";
  };
  std::string protocol = get({"protocol"});
  if (!protocol.empty() && protocol != "http" && protocol != "https")
    throw UsageError(fmt::format("--rdzv-conf protocol={}: want http or https", protocol));
  for (std::string e : splitList(o.rdzv_endpoint, ',')) {
    // etcd's own spelling of an endpoint (http://host:2379) says the protocol too.
    for (const char* scheme : {"http://", "https://"})
      if (e.rfind(scheme, 0) == 0) {
        std::string p = std::string(scheme).substr(0, std::string(scheme).find(':'));
        if (!protocol.empty() && protocol != p)
          throw UsageError(fmt::format("--rdzv-endpoint {} disagrees with --rdzv-conf protocol={}",
                                       e, protocol));
        protocol = p;
        e = e.substr(std::string(scheme).size());
      }
    HostPort hp = parseHostPort("--rdzv-endpoint", e, kEtcdDefaultPort);
    c.etcd.endpoints.push_back(fmt::format(
        "{}:{}", hp.host.find(':') != std::string::npos ? "[" + hp.host + "]" : hp.host, hp.port));
  }
  if (c.etcd.endpoints.empty())
    throw UsageError(
        "--rdzv-backend=etcd needs --rdzv-endpoint HOST[:PORT][,HOST[:PORT]...] (etcd's client "
        "URLs)");
  c.etcd.ca_file = get({"cacert", "ca_cert"});
  if (c.etcd.ca_file.empty()) c.etcd.ca_file = o.rdzv_conf.tls_ca_file;
  c.etcd.cert_file = get({"cert", "ssl_cert"});
  c.etcd.key_file = get({"key", "ssl_cert_key"});
  if (protocol == "https" && c.etcd.ca_file.empty())
    throw UsageError(
        "--rdzv-conf protocol=https needs cacert=FILE (the CA that signed etcd's certificate)");
  if (protocol == "http" && !c.etcd.ca_file.empty())
    throw UsageError("--rdzv-conf protocol=http with a cacert: drop one (a CA means TLS)");
  if (c.etcd.cert_file.empty() != c.etcd.key_file.empty())
    throw UsageError("--rdzv-conf cert and key go together: give both or neither");
  if (!c.etcd.cert_file.empty() && c.etcd.ca_file.empty())
    throw UsageError("--rdzv-conf cert/key need TLS: give cacert too");
  c.etcd.user = get({"user"});
  // The password never travels on the command line (ps shows it to every user): a file, or
  // the environment.
  if (std::string f = get({"password_file"}); !f.empty()) {
    if (c.etcd.user.empty()) throw UsageError("--rdzv-conf password_file needs user= too");
    c.etcd.password = rdzv::readTokenFile(f);
  } else if (auto it = env.find(envvar::kEtcdPassword); it != env.end() && !c.etcd.user.empty()) {
    c.etcd.password = it->second;
  } else if (!c.etcd.user.empty()) {
    throw UsageError(
        fmt::format("--rdzv-conf user={} needs its password: password_file=FILE or "
                    "DDPL_ETCD_PASSWORD in the environment",
                    c.etcd.user));
  }
  if (std::string p = get({"etcd_prefix"}); !p.empty()) {
    if (p.front() != '/')
      throw UsageError(fmt::format("--rdzv-conf etcd_prefix={}: must start with /", p));
    c.prefix = p;
  }
  if (std::string t = get({"lease_ttl"}); !t.empty())
    c.lease_ttl = std::chrono::seconds(
        static_cast<int64_t>(parseNumber("--rdzv-conf lease_ttl", t, 1, 86400) + 0.5));
  auto ms = [](double sec) { return std::chrono::milliseconds(static_cast<int64_t>(sec * 1000)); };
  c.etcd.connect_timeout = std::chrono::seconds(10);
  if (std::string t = get({"connect_timeout"}); !t.empty())
    c.etcd.connect_timeout = ms(parseNumber("--rdzv-conf connect_timeout", t, 0.001, 86400));
  c.etcd.call_timeout =
      std::min(rounds.read_timeout, std::chrono::milliseconds(std::chrono::seconds(30)));
  if (c.etcd.call_timeout < c.etcd.connect_timeout) c.etcd.call_timeout = c.etcd.connect_timeout;
  return c;
}

}  // namespace ddpl::launcher
