#pragma once
// Real etcd servers for tests: a cluster of N members on free loopback ports (etcd cannot bind
// port 0), data in a temporary directory, SIGKILLed and removed by the destructor.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "tests/common/subprocess.h"

namespace ddpl::testing {

inline const char* kEtcd = "/usr/bin/etcd";
inline const char* kEtcdctl = "/usr/bin/etcdctl";

// Client TLS for the cluster: etcd's server certificate and key, the CA that signed it (and
// the clients' certificates), and whether clients must present one.
struct EtcdTls {
  std::string ca, cert, key;
  bool client_cert_auth = false;
};

// A CA and one certificate for 127.0.0.1, good for both ends (server and client auth), made
// with the openssl CLI in `dir`; nothing when openssl cannot make them.
inline std::optional<EtcdTls> makeTestTls(const std::string& dir, bool client_cert_auth) {
  std::string script =
      "set -e; cd " + dir +
      "; openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=test-ca -keyout ca.key "
      "-out ca.pem 2>/dev/null; openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 "
      "-keyout node.key -out node.csr 2>/dev/null; printf "
      "'subjectAltName=IP:127.0.0.1\\nextendedKeyUsage=serverAuth,clientAuth\\n' > ext; openssl "
      "x509 -req -in node.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 -extfile ext -out "
      "node.pem 2>/dev/null";
  if (run({"/bin/sh", "-c", script}).exit_code != 0) return std::nullopt;
  return EtcdTls{dir + "/ca.pem", dir + "/node.pem", dir + "/node.key", client_cert_auth};
}

// An etcd cluster of `members` on free loopback ports (etcd cannot bind port 0).
class EtcdCluster {
 public:
  static bool installed() { return access(kEtcd, X_OK) == 0 && access(kEtcdctl, X_OK) == 0; }
  explicit EtcdCluster(int members, std::optional<EtcdTls> tls = std::nullopt)
      : dir_(makeTempDir("etcd")), tls_(tls) {
    for (int i = 0; i < members; ++i) {
      client_.push_back(freeLoopbackPort());
      peer_.push_back(freeLoopbackPort());
    }
    std::string initial;
    for (int i = 0; i < members; ++i)
      initial += (i ? "," : "") + name(i) + "=http://127.0.0.1:" + std::to_string(peer_[i]);
    for (int i = 0; i < members; ++i) {
      std::string c = (tls_ ? "https://127.0.0.1:" : "http://127.0.0.1:") + std::to_string(client_[i]);
      std::string p = "http://127.0.0.1:" + std::to_string(peer_[i]);
      std::vector<std::string> argv{
          kEtcd, "--name", name(i), "--data-dir", dir_ + "/" + name(i), "--listen-client-urls", c,
          "--advertise-client-urls", c, "--listen-peer-urls", p, "--initial-advertise-peer-urls",
          p, "--initial-cluster", initial, "--initial-cluster-token", "t" + std::to_string(client_[0]),
          "--heartbeat-interval", "100", "--election-timeout", "1000", "--log-level", "warn"};
      if (tls_) {
        argv.insert(argv.end(), {"--cert-file", tls_->cert, "--key-file", tls_->key,
                                 "--trusted-ca-file", tls_->ca});
        if (tls_->client_cert_auth) argv.push_back("--client-cert-auth");
      }
      procs_.push_back(std::make_unique<Background>(argv));
    }
    healthy_ = eventually([&] { return ctl({"endpoint", "health", "--cluster"}).exit_code == 0; }, std::chrono::seconds(30));
  }
  ~EtcdCluster() {
    procs_.clear();  // SIGKILLs whatever still runs
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  bool healthy() const { return healthy_; }
  std::string endpoints() const {
    std::string out;
    for (size_t i = 0; i < client_.size(); ++i)
      out += (i ? "," : "") + std::string("127.0.0.1:") + std::to_string(client_[i]);
    return out;
  }
  RunResult ctl(std::vector<std::string> args, const std::string& endpoints = "") {
    std::vector<std::string> argv = {kEtcdctl, "--endpoints=" + (endpoints.empty() ? this->endpoints() : endpoints),
                                     "--dial-timeout=2s", "--command-timeout=5s"};
    if (tls_) argv.insert(argv.end(), {"--cacert=" + tls_->ca, "--cert=" + tls_->cert, "--key=" + tls_->key});
    argv.insert(argv.end(), args.begin(), args.end());
    RunOptions o;
    o.env = {{"ETCDCTL_API", "3"}};
    o.timeout = std::chrono::seconds(20);
    return run(argv, o);
  }
  // Keys under `prefix` (as root when auth is on).
  std::string keys(const std::string& prefix, std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"get", "--prefix", prefix, "--keys-only"};
    args.insert(args.end(), extra.begin(), extra.end());
    return ctl(args).out;
  }
  int leader() {
    for (size_t i = 0; i < client_.size(); ++i) {
      auto r = ctl({"endpoint", "status", "-w", "fields"}, "127.0.0.1:" + std::to_string(client_[i]));
      std::smatch m1, m2;
      std::regex member("\"MemberID\" : (\\d+)"), leader("\"Leader\" : (\\d+)");
      if (std::regex_search(r.out, m1, member) && std::regex_search(r.out, m2, leader) &&
          m1[1] == m2[1])
        return static_cast<int>(i);
    }
    return -1;
  }
  void kill9(int i) { kill(procs_[i]->pid(), SIGKILL); }
  // SIGSTOP / SIGCONT: a member that stalls without closing its connections.
  void sendSignal(int i, int sig) { kill(procs_[i]->pid(), sig); }
  std::string endpoint(int i) const { return "127.0.0.1:" + std::to_string(client_[i]); }
  // The sum of member i's /metrics samples whose line starts with `prefix` (etcd serves them
  // on its client port; plain HTTP only); -1 when it cannot be read.
  double metric(int i, const std::string& prefix) const {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    timeval tv{5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(client_[i]));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    std::string text;
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
      std::string req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
      if (::send(fd, req.data(), req.size(), 0) == static_cast<ssize_t>(req.size())) {
        char buf[65536];
        for (ssize_t n; (n = recv(fd, buf, sizeof buf, 0)) > 0;)
          text.append(buf, static_cast<size_t>(n));
      }
    }
    close(fd);
    if (text.find("\r\n\r\n") == std::string::npos) return -1;
    double sum = 0;
    size_t pos = 0;
    while (pos < text.size()) {
      size_t end = text.find('\n', pos);
      if (end == std::string::npos) end = text.size();
      std::string line = text.substr(pos, end - pos);
      if (line.rfind(prefix, 0) == 0) sum += std::stod(line.substr(line.rfind(' ') + 1));
      pos = end + 1;
    }
    return sum;
  }

 private:
  static std::string name(int i) { return "m" + std::to_string(i); }
  std::string dir_;
  std::vector<int> client_, peer_;
  std::vector<std::unique_ptr<Background>> procs_;
  std::optional<EtcdTls> tls_;
  bool healthy_ = false;
};


}  // namespace ddpl::testing
