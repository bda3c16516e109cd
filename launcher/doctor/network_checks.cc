#include <fmt/format.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/parse.h"
#include "launcher/doctor/check_util.h"
#include "launcher/doctor/doctor.h"

namespace ddpl::launcher {
using checks::dirEntries;
using checks::joinSet;

namespace {

// NCCL_SOCKET_IFNAME / NCCL_IB_HCA syntax: "^" excludes, "=" matches exactly, otherwise each
// item is a prefix. Returns the interfaces the value selects.
std::set<std::string> ncclSelect(const std::string& value, const std::set<std::string>& have,
                                 bool strip_port) {
  std::string v = value;
  bool exclude = false, exact = false;
  if (!v.empty() && v[0] == '^') exclude = true, v = v.substr(1);
  if (!v.empty() && v[0] == '=') exact = true, v = v.substr(1);
  std::vector<std::string> items;
  for (auto item : splitList(v, ',')) {
    if (strip_port) item = item.substr(0, item.find(':'));
    if (!item.empty()) items.push_back(item);
  }
  std::set<std::string> out;
  for (const auto& name : have) {
    bool match = std::any_of(items.begin(), items.end(), [&](const std::string& i) {
      return exact ? name == i : name.rfind(i, 0) == 0;
    });
    if (match != exclude) out.insert(name);
  }
  return out;
}

}  // namespace

std::vector<Finding> checkNetworkNames(const std::map<std::string, std::string>& env,
                                       const std::string& sys_root) {
  std::vector<Finding> out;
  std::set<std::string> nets = dirEntries(sys_root + "/class/net");
  if (auto it = env.find("NCCL_SOCKET_IFNAME"); it != env.end()) {
    auto chosen = ncclSelect(it->second, nets, false);
    Finding f{"NCCL_SOCKET_IFNAME", Verdict::kOk, fmt::format("'{}'", it->second), ""};
    if (chosen.empty()) {
      f.verdict = Verdict::kFail;
      f.value += fmt::format(" selects no interface (this node has {})", joinSet(nets));
      f.advice =
          "NCCL will fail with 'no socket interface found': name an interface that "
          "exists here, or unset it";
    } else {
      f.value += " selects " + joinSet(chosen);
    }
    out.push_back(f);
  }
  if (auto it = env.find("GLOO_SOCKET_IFNAME"); it != env.end()) {
    Finding f{"GLOO_SOCKET_IFNAME", Verdict::kOk, fmt::format("'{}'", it->second), ""};
    std::set<std::string> missing;
    for (const auto& name : splitList(it->second, ','))
      if (!nets.count(name)) missing.insert(name);
    if (!missing.empty() || splitList(it->second, ',').empty()) {
      f.verdict = Verdict::kFail;
      f.value +=
          fmt::format(": no interface {} here (this node has {})", joinSet(missing), joinSet(nets));
      f.advice = "Gloo will fail to create its device: name an interface that exists, or unset it";
    }
    out.push_back(f);
  }
  if (auto it = env.find("NCCL_IB_HCA"); it != env.end()) {
    std::set<std::string> hcas = dirEntries(sys_root + "/class/infiniband");
    auto chosen = ncclSelect(it->second, hcas, true);
    Finding f{"NCCL_IB_HCA", Verdict::kOk, fmt::format("'{}'", it->second), ""};
    if (chosen.empty()) {
      f.verdict = Verdict::kWarn;
      f.value += fmt::format(" selects no InfiniBand device (this node has {})", joinSet(hcas));
      f.advice =
          "NCCL falls back to TCP sockets, far slower: name HCAs that exist "
          "(ls /sys/class/infiniband)";
    } else {
      f.value += " selects " + joinSet(chosen);
    }
    out.push_back(f);
  }
  return out;
}

Finding checkEndpoint(const std::string& name, const std::string& host_port, bool connect,
                      double timeout_sec) {
  Finding f{name, Verdict::kOk, host_port, ""};
  HostPort hp;
  try {
    hp = parseHostPort(name, host_port, 0);
  } catch (const std::exception& e) {
    f.verdict = Verdict::kFail;
    f.value = e.what();
    return f;
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(hp.host.c_str(), nullptr, &hints, &res);
  if (rc != 0) {
    f.verdict = Verdict::kFail;
    f.value += fmt::format(": '{}' does not resolve ({})", hp.host, gai_strerror(rc));
    f.advice = "use a name every node resolves, or an address";
    return f;
  }
  char addr[NI_MAXHOST] = "?";
  getnameinfo(res->ai_addr, res->ai_addrlen, addr, sizeof(addr), nullptr, 0, NI_NUMERICHOST);
  f.value += fmt::format(" resolves to {}", addr);
  if (connect && hp.port > 0) {
    bool reached = false;
    std::string why = "no address";
    for (addrinfo* ai = res; ai && !reached; ai = ai->ai_next) {
      int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      if (fd < 0) continue;
      reinterpret_cast<sockaddr_in*>(ai->ai_addr)->sin_port = htons(static_cast<uint16_t>(hp.port));
      int c = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
      if (c != 0 && errno == EINPROGRESS) {
        pollfd p{fd, POLLOUT, 0};
        if (poll(&p, 1, static_cast<int>(timeout_sec * 1000)) == 1) {
          int err = 0;
          socklen_t len = sizeof(err);
          getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
          c = err == 0 ? 0 : -1;
          why = err ? strerror(err) : "";
        } else {
          why = fmt::format("no answer within {:.0f}s", timeout_sec);
        }
      } else if (c != 0) {
        why = strerror(errno);
      }
      reached = c == 0;
      close(fd);
    }
    if (reached) {
      f.value += fmt::format(", port {} answers", hp.port);
    } else {
      f.verdict = Verdict::kWarn;
      f.value += fmt::format(", port {} does not answer ({})", hp.port, why);
      f.advice =
          "fine before the job starts if the first agent hosts it; otherwise check the "
          "service and the firewall";
    }
  }
  freeaddrinfo(res);
  return f;
}

}  // namespace ddpl::launcher
