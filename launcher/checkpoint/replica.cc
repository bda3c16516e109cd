#include "launcher/checkpoint/replica.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <thread>
#include <vector>

#include "common/checkpoint_files.h"
#include "common/errors.h"
#include "common/file_io.h"
#include "common/log.h"

namespace fs = std::filesystem;

namespace ddpl::launcher {

namespace {

constexpr const char* kMagic = "DDPLREP1";
constexpr size_t kMaxLine = 512;
constexpr size_t kChunk = 1 << 20;

struct Fd {
  int fd = -1;
  explicit Fd(int f = -1) : fd(f) {}
  Fd(Fd&& o) noexcept : fd(o.fd) { o.fd = -1; }
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      if (fd >= 0) close(fd);
      fd = o.fd;
      o.fd = -1;
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

std::string errnoText() { return std::string(strerror(errno)); }

void setTimeouts(int fd, double seconds) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(seconds);
  tv.tv_usec = static_cast<suseconds_t>((seconds - static_cast<double>(tv.tv_sec)) * 1e6);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

void sendAll(int fd, const void* data, size_t size, const std::string& peer) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = send(fd, p, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      throw NetworkError("checkpoint replica " + peer +
                         ": send: " + (errno == EAGAIN ? std::string("timed out") : errnoText()));
    p += n;
    size -= static_cast<size_t>(n);
  }
}

void recvExact(int fd, void* data, size_t size, const std::string& peer) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    ssize_t n = recv(fd, p, size, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) throw NetworkError("checkpoint replica " + peer + ": connection closed");
    if (n < 0)
      throw NetworkError("checkpoint replica " + peer + ": receive: " +
                         (errno == EAGAIN ? std::string("timed out") : errnoText()));
    p += n;
    size -= static_cast<size_t>(n);
  }
}

std::string recvLine(int fd, const std::string& peer) {
  std::string line;
  char c;
  while (line.size() < kMaxLine) {
    recvExact(fd, &c, 1, peer);
    if (c == '\n') return line;
    line.push_back(c);
  }
  throw InvalidArgument("checkpoint replica " + peer + ": a line over " + std::to_string(kMaxLine) +
                        " bytes");
}

// Copies `size` bytes from the socket into a new file (exclusive, no symlink followed).
void recvFile(int sock, const std::string& path, uint64_t size, const std::string& peer) {
  Fd out(open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (out.fd < 0) throw Error("cannot create " + path + ": " + errnoText());
  std::vector<char> buf(static_cast<size_t>(std::min<uint64_t>(size, kChunk)));
  while (size > 0) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(size, buf.size()));
    recvExact(sock, buf.data(), n, peer);
    if (int e = writeAll(out.fd, buf.data(), n))
      throw Error("cannot write " + path + ": " + strerror(e));
    size -= n;
  }
}

void sendFiles(int sock, const std::string& step_dir, const ckpt::CommitRecord& r,
               const std::string& peer) {
  // Opened first, all of them: the writer may trim the step while it is sent.
  std::vector<Fd> fds;
  for (const auto& f : r.files) {
    std::string p = step_dir + "/" + f.path;
    fds.emplace_back(open(p.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    if (fds.back().fd < 0) throw Error("cannot open " + p + ": " + errnoText());
  }
  for (size_t i = 0; i < r.files.size(); ++i) {
    off_t off = 0;
    uint64_t left = r.files[i].size;
    while (left > 0) {
      ssize_t n =
          sendfile(sock, fds[i].fd, &off, static_cast<size_t>(std::min<uint64_t>(left, kChunk)));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0)
        throw NetworkError("checkpoint replica " + peer + ": send " + r.files[i].path + ": " +
                           (n == 0 ? std::string("file shorter than its record") : errnoText()));
      left -= static_cast<uint64_t>(n);
    }
  }
}

// Receives a record and its files into rank_dir/step-<N> as a committed step.
uint64_t recvStep(int sock, size_t record_bytes, const std::string& rank_dir,
                  const std::string& peer, const std::string& origin, ckpt::CommitRecord* out,
                  uint64_t max_bytes) {
  if (record_bytes > ckpt::kMaxRecordBytes)
    throw InvalidArgument("checkpoint replica " + peer + ": record of " +
                          std::to_string(record_bytes) + " bytes");
  std::string text(record_bytes, '\0');
  recvExact(sock, text.data(), text.size(), peer);
  ckpt::CommitRecord r = ckpt::decodeRecord(text);
  if (r.bytes > max_bytes)
    throw InvalidArgument("checkpoint replica: step " + std::to_string(r.step) + " of rank " +
                          std::to_string(r.rank) + " is " + std::to_string(r.bytes) +
                          " bytes, over the " + std::to_string(max_bytes) + " this node holds");
  if (mkdir(rank_dir.c_str(), 0700) != 0 && errno != EEXIST)
    throw Error("cannot create " + rank_dir + ": " + errnoText());
  std::string partial = rank_dir + "/" + ckpt::partialDirName(r.step, static_cast<long>(getpid()));
  ckpt::removePartials(rank_dir, static_cast<long>(getpid()));
  if (mkdir(partial.c_str(), 0700) != 0)
    throw Error("cannot create " + partial + ": " + errnoText());
  try {
    for (const auto& f : r.files) {
      std::string to = partial + "/" + f.path;
      std::error_code ec;
      fs::create_directories(fs::path(to).parent_path(), ec);
      recvFile(sock, to, f.size, peer);
    }
    if (!origin.empty())
      writeFileAtomically(partial + "/" + kOriginFile, origin + "\n",
                          AtomicWriteOptions{0600, false});
    writeFileAtomically(partial + "/" + ckpt::kRecordName, text, AtomicWriteOptions{0600, false});
    std::string target = rank_dir + "/" + ckpt::stepDirName(r.step);
    // A stale round's replica (its node lost the rendezvous) must not replace a newer one here.
    ckpt::FenceGuard fence(rank_dir, r.writer,
                           "checkpoint replica of step " + std::to_string(r.step) + " of rank " +
                               std::to_string(r.rank) + " from " + peer);
    std::error_code ec;
    fs::remove_all(target, ec);
    if (rename(partial.c_str(), target.c_str()) != 0)
      throw Error("cannot commit " + target + ": " + errnoText());
  } catch (...) {
    std::error_code ec;
    fs::remove_all(partial, ec);
    throw;
  }
  if (out) *out = r;
  return r.bytes;
}

Fd connectTo(const ReplicaEndpoint& to, double timeout_sec) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::string port = std::to_string(to.port);
  if (int rc = getaddrinfo(to.host.c_str(), port.c_str(), &hints, &res))
    throw NetworkError("checkpoint replica " + to.describe() + ": " + gai_strerror(rc));
  std::string last = "no address";
  for (addrinfo* a = res; a; a = a->ai_next) {
    Fd fd(socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (fd.fd < 0) continue;
    setTimeouts(fd.fd, timeout_sec);
    if (connect(fd.fd, a->ai_addr, a->ai_addrlen) == 0) {
      freeaddrinfo(res);
      return fd;
    }
    last = errnoText();
  }
  freeaddrinfo(res);
  throw NetworkError("checkpoint replica " + to.describe() + ": connect: " + last);
}

std::string request(const ReplicaEndpoint& to, const std::string& op) {
  return std::string(kMagic) + " " + to.secret + " " + op + "\n";
}

void expectOk(const std::string& line, const std::string& peer) {
  if (line.rfind("OK", 0) != 0)
    throw Error("checkpoint replica " + peer +
                " refused: " + (line.rfind("ERR ", 0) == 0 ? line.substr(4) : line));
}

bool sameSecret(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

std::string encodeEndpoint(const ReplicaEndpoint& e) {
  return e.host + " " + std::to_string(e.port) + " " + e.secret;
}

std::optional<ReplicaEndpoint> parseEndpoint(const std::string& text) {
  std::istringstream in(text);
  ReplicaEndpoint e;
  if (!(in >> e.host >> e.port >> e.secret) || e.port <= 0 || e.port > 65535 ||
      e.secret.size() != 32)
    return std::nullopt;
  return e;
}

struct ReplicaServer::Impl {
  std::string dir;
  uint64_t budget_per_rank, total_budget;
  int64_t keep;
  std::string secret;
  int listen_fd = -1, stop_fd = -1, port = 0;
  std::thread thread;
  log::Limiter refusals{std::chrono::seconds(30)};

  void handle(int sock, const std::string& peer, const std::string& request_line) {
    setTimeouts(sock, 30);
    std::istringstream line(request_line);
    std::string magic, given, op;
    line >> magic >> given >> op;
    if (magic != kMagic) throw InvalidArgument("not a checkpoint replica request");
    if (!sameSecret(given, secret)) throw InvalidArgument("wrong secret");
    if (op == "PUSH") {
      size_t record_bytes = 0;
      if (!(line >> record_bytes)) throw InvalidArgument("PUSH without a record size");
      uint64_t held = 0;
      std::error_code ec;
      for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
        held += ckpt::rankUsage(it->path().string()).committed;
      if (held >= total_budget)
        throw InvalidArgument("this node holds " + std::to_string(held) +
                              " bytes of replicas, its limit is " + std::to_string(total_budget));
      ckpt::CommitRecord r;
      // The rank's directory is named after the record, read first; recvStep checks it again.
      std::string tmp_dir = dir + "/incoming";
      recvStep(sock, record_bytes, tmp_dir, peer, "peer " + peer, &r,
               std::min(budget_per_rank, total_budget - held));
      std::string rank_dir = dir + "/" + ckpt::rankDirName(r.rank);
      if (mkdir(rank_dir.c_str(), 0700) != 0 && errno != EEXIST)
        throw Error("cannot create " + rank_dir + ": " + errnoText());
      std::string from = tmp_dir + "/" + ckpt::stepDirName(r.step);
      std::string to = rank_dir + "/" + ckpt::stepDirName(r.step);
      fs::remove_all(to, ec);
      if (rename(from.c_str(), to.c_str()) != 0)
        throw Error("cannot keep " + to + ": " + errnoText());
      ckpt::trimCommitted(rank_dir, keep, r.step);
      sendAll(sock, "OK\n", 3, peer);
    } else if (op == "LIST") {
      int64_t rank = -1, world = -1;
      if (!(line >> rank >> world) || rank < 0 || world < 1) throw InvalidArgument("bad LIST");
      std::string answer = "OK";
      for (const auto& s : ckpt::listCommitted(dir + "/" + ckpt::rankDirName(rank), rank))
        if (s.record.world_size == world) answer += " " + std::to_string(s.step);
      answer += "\n";
      sendAll(sock, answer.data(), answer.size(), peer);
    } else if (op == "GET") {
      int64_t rank = -1, step = -1;
      if (!(line >> rank >> step) || rank < 0 || step < 0) throw InvalidArgument("bad GET");
      std::string step_dir = dir + "/" + ckpt::rankDirName(rank) + "/" + ckpt::stepDirName(step);
      auto r = ckpt::readCommitted(step_dir, step, rank);
      if (!r)
        throw InvalidArgument("no step " + std::to_string(step) + " of rank " +
                              std::to_string(rank));
      std::string text = ckpt::encodeRecord(*r);
      std::string head = "OK " + std::to_string(text.size()) + "\n";
      sendAll(sock, head.data(), head.size(), peer);
      sendAll(sock, text.data(), text.size(), peer);
      sendFiles(sock, step_dir, *r, peer);
    } else {
      throw InvalidArgument("unknown operation '" + op + "'");
    }
  }

  // A connection whose request line has not arrived yet. The line is read by the loop from
  // every such connection at once, within kHelloSeconds, before the secret is known: one peer
  // that connects and sends nothing (or a byte a minute) must not hold the only thread that
  // takes this node's replicas, as it did when each connection was served to its end in turn.
  struct Hello {
    Fd sock;
    std::string peer, line;
    std::chrono::steady_clock::time_point deadline;
  };
  static constexpr int kHelloSeconds = 5;
  static constexpr size_t kMaxHellos = 32;  // more at once: the oldest is closed

  void refused(int sock, const std::string& peer, const std::string& why) {
    std::string answer = "ERR " + why;
    for (auto& c : answer)
      if (c == '\n') c = ' ';
    answer += "\n";
    send(sock, answer.data(), answer.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    int64_t held = 0;
    if (refusals.admit(&held))
      log::warn("checkpoint replica request from {} refused: {}{}", peer, why,
                held ? " (" + std::to_string(held) + " more not shown)" : "");
  }

  void accept1(std::vector<Hello>& hellos) {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    Fd sock(
        accept4(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (sock.fd < 0) return;
    char host[NI_MAXHOST] = "?", serv[NI_MAXSERV] = "?";
    getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, host, sizeof(host), serv, sizeof(serv),
                NI_NUMERICHOST | NI_NUMERICSERV);
    if (hellos.size() >= kMaxHellos) {
      refused(hellos.front().sock.fd, hellos.front().peer,
              "closed for a newer connection: " + std::to_string(kMaxHellos) +
                  " were waiting for their request");
      hellos.erase(hellos.begin());
    }
    hellos.push_back({std::move(sock), std::string(host) + ":" + serv, "",
                      std::chrono::steady_clock::now() + std::chrono::seconds(kHelloSeconds)});
  }

  // Reads what has arrived of the request line, never past its newline (a PUSH's record
  // follows it). True when the connection is done with: its line is complete (`complete`),
  // or it ended or broke the limits (refused).
  bool readHello(Hello& h, bool* complete) {
    char buf[kMaxLine];
    ssize_t n = recv(h.sock.fd, buf, sizeof(buf) - h.line.size(), MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return false;
    if (n <= 0) return true;
    size_t take = static_cast<size_t>(n);
    const char* nl = static_cast<const char*>(memchr(buf, '\n', take));
    if (nl) take = static_cast<size_t>(nl - buf) + 1;
    if (recv(h.sock.fd, buf, take, MSG_DONTWAIT) != static_cast<ssize_t>(take)) return true;
    h.line.append(buf, nl ? take - 1 : take);
    if (nl) {
      *complete = true;
      return true;
    }
    if (h.line.size() >= kMaxLine - 1) {
      refused(h.sock.fd, h.peer, "a request line over " + std::to_string(kMaxLine) + " bytes");
      return true;
    }
    return false;
  }

  void serve(Hello& h) {
    // The transfers themselves block, with their 30 s timeouts: only a peer that knows the
    // secret gets here.
    fcntl(h.sock.fd, F_SETFL, fcntl(h.sock.fd, F_GETFL) & ~O_NONBLOCK);
    try {
      handle(h.sock.fd, h.peer, h.line);
    } catch (const std::exception& e) {
      refused(h.sock.fd, h.peer, e.what());
    }
  }

  void run() {
    std::vector<Hello> hellos;
    std::vector<pollfd> fds;
    for (;;) {
      // Oldest first, and so soonest due: every deadline is its arrival plus kHelloSeconds,
      // and a connection served moves them all alike.
      auto now = std::chrono::steady_clock::now();
      while (!hellos.empty() && hellos.front().deadline <= now) {
        refused(hellos.front().sock.fd, hellos.front().peer,
                "no request within " + std::to_string(kHelloSeconds) + " s of connecting");
        hellos.erase(hellos.begin());
      }
      int timeout_ms = -1;
      if (!hellos.empty())
        timeout_ms = static_cast<int>(std::max<int64_t>(
            1, std::chrono::duration_cast<std::chrono::milliseconds>(hellos.front().deadline - now)
                   .count()));
      fds.assign({{listen_fd, POLLIN, 0}, {stop_fd, POLLIN, 0}});
      for (const auto& h : hellos) fds.push_back({h.sock.fd, POLLIN, 0});
      if (poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) return;
      if (fds[1].revents) return;
      std::vector<Hello> waiting, ready;
      for (size_t i = 0; i < hellos.size(); ++i) {
        bool complete = false;
        if (!fds[i + 2].revents || !readHello(hellos[i], &complete))
          waiting.push_back(std::move(hellos[i]));
        else if (complete)
          ready.push_back(std::move(hellos[i]));
      }
      hellos = std::move(waiting);
      // Oldest first. One served to its end may take a while: the others' clocks stop
      // meanwhile (their lines may be waiting in their sockets).
      for (auto& h : ready) {
        auto began = std::chrono::steady_clock::now();
        serve(h);
        auto spent = std::chrono::steady_clock::now() - began;
        for (auto& other : hellos) other.deadline += spent;
      }
      if (fds[0].revents & POLLIN) accept1(hellos);
    }
  }
};

ReplicaServer::ReplicaServer(std::string dir, uint64_t budget_per_rank, uint64_t total_budget,
                             int64_t keep)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.dir = std::move(dir);
  m.budget_per_rank = budget_per_rank;
  m.total_budget = total_budget;
  m.keep = keep;
  if (mkdir(m.dir.c_str(), 0700) != 0 && errno != EEXIST)
    throw Error("cannot create " + m.dir + ": " + errnoText());
  unsigned char raw[16];
  if (getrandom(raw, sizeof(raw), 0) != static_cast<ssize_t>(sizeof(raw)))
    throw Error("cannot draw the replica secret: " + errnoText());
  static const char* hex = "0123456789abcdef";
  for (unsigned char b : raw) {
    m.secret.push_back(hex[b >> 4]);
    m.secret.push_back(hex[b & 15]);
  }
  m.listen_fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int off = 0, on = 1;
  if (m.listen_fd >= 0) {
    setsockopt(m.listen_fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off));  // v4 too
    setsockopt(m.listen_fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    socklen_t len = sizeof(a);
    if (bind(m.listen_fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
        listen(m.listen_fd, 16) != 0 ||
        getsockname(m.listen_fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      close(m.listen_fd);
      m.listen_fd = -1;
    } else {
      m.port = ntohs(a.sin6_port);
    }
  }
  m.stop_fd = eventfd(0, EFD_CLOEXEC);
  if (m.listen_fd < 0 || m.stop_fd < 0) {
    std::string why = errnoText();
    if (m.listen_fd >= 0) close(m.listen_fd);
    if (m.stop_fd >= 0) close(m.stop_fd);
    throw Error("cannot listen for checkpoint replicas: " + why);
  }
  m.thread = std::thread([&m] { m.run(); });
}

ReplicaServer::~ReplicaServer() {
  uint64_t one = 1;
  (void)!write(impl_->stop_fd, &one, sizeof(one));
  if (impl_->thread.joinable()) impl_->thread.join();
  close(impl_->listen_fd);
  close(impl_->stop_fd);
}

int ReplicaServer::port() const { return impl_->port; }
const std::string& ReplicaServer::secret() const { return impl_->secret; }

void pushStep(const ReplicaEndpoint& to, const std::string& step_dir,
              const ckpt::CommitRecord& record, double timeout_sec,
              const std::function<void(int)>& on_socket) {
  Fd sock = connectTo(to, std::min(timeout_sec, 5.0));
  setTimeouts(sock.fd, timeout_sec);
  struct Told {  // declared after sock: says -1 before sock closes
    const std::function<void(int)>& f;
    ~Told() {
      if (f) f(-1);
    }
  } told{on_socket};
  if (on_socket) on_socket(sock.fd);
  std::string text = ckpt::encodeRecord(record);
  std::string head = request(to, "PUSH " + std::to_string(text.size()));
  sendAll(sock.fd, head.data(), head.size(), to.describe());
  sendAll(sock.fd, text.data(), text.size(), to.describe());
  sendFiles(sock.fd, step_dir, record, to.describe());
  expectOk(recvLine(sock.fd, to.describe()), to.describe());
}

std::vector<int64_t> listSteps(const ReplicaEndpoint& from, int64_t rank, int64_t world_size,
                               double timeout_sec) {
  Fd sock = connectTo(from, timeout_sec);
  std::string head =
      request(from, "LIST " + std::to_string(rank) + " " + std::to_string(world_size));
  sendAll(sock.fd, head.data(), head.size(), from.describe());
  std::string line = recvLine(sock.fd, from.describe());
  expectOk(line, from.describe());
  std::istringstream in(line.substr(2));
  std::vector<int64_t> steps;
  int64_t s;
  while (in >> s) steps.push_back(s);
  return steps;
}

uint64_t fetchStep(const ReplicaEndpoint& from, int64_t rank, int64_t step,
                   const std::string& rank_dir, double timeout_sec) {
  Fd sock = connectTo(from, timeout_sec);
  std::string head = request(from, "GET " + std::to_string(rank) + " " + std::to_string(step));
  sendAll(sock.fd, head.data(), head.size(), from.describe());
  std::string line = recvLine(sock.fd, from.describe());
  expectOk(line, from.describe());
  // "OK <record bytes>", from another machine: std::stoul threw std::out_of_range for a bare
  // "OK" and took " -1" for 2^64-1; recvStep checks the size's range.
  size_t record_bytes = 0;
  const char* digits = line.c_str() + std::min<size_t>(3, line.size());
  auto [end, ec] = std::from_chars(digits, line.c_str() + line.size(), record_bytes);
  if (line.size() < 4 || line[2] != ' ' || ec != std::errc() || end != line.c_str() + line.size())
    throw InvalidArgument("checkpoint replica " + from.describe() +
                          ": an answer without its record's size: '" + line.substr(0, 64) + "'");
  ckpt::CommitRecord r;
  uint64_t bytes = recvStep(sock.fd, record_bytes, rank_dir, from.describe(),
                            "peer " + from.describe(), &r, UINT64_MAX);
  if (r.rank != rank || r.step != step)
    throw Error("checkpoint replica " + from.describe() + " sent step " + std::to_string(r.step) +
                " of rank " + std::to_string(r.rank) + " for step " + std::to_string(step) +
                " of rank " + std::to_string(rank));
  return bytes;
}

}  // namespace ddpl::launcher
