#include "launcher/output.h"

#include <unistd.h>

#include <cerrno>

namespace ddpl::launcher {

void writeAll(int fd, const char* data, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, data, len);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;
    }
    data += n;
    len -= static_cast<size_t>(n);
  }
}

OutputRouter::OutputRouter(std::string role, int console_out, int console_err)
    : role_(std::move(role)), console_out_(console_out), console_err_(console_err) {}

OutputRouter::~OutputRouter() {
  for (auto& [fd, s] : streams_) {
    if (!s.pending.empty()) emitLine(s, s.pending.data(), s.pending.size(), false);
    if (s.route.file_fd >= 0) close(s.route.file_fd);
    close(fd);
  }
}

void OutputRouter::add(int fd, const StreamRoute& route) { streams_[fd] = Stream{route, {}}; }

void OutputRouter::emitLine(Stream& s, const char* data, size_t len, bool newline_present) {
  if (s.route.file_fd >= 0) {
    writeAll(s.route.file_fd, data, len);
    if (newline_present) writeAll(s.route.file_fd, "\n", 1);
  }
  if (s.route.kind == StreamKind::kStderr) {
    auto& tail = stderr_tail_[s.route.local_rank];
    tail.emplace_back(data, len);
    if (tail.size() > kTailLines) tail.pop_front();
  }
  if (s.route.to_console) {
    // One write per line: the console sees whole lines from each worker.
    std::string line = "[" + role_ + std::to_string(s.route.global_rank) + "]:";
    line.append(data, len);
    line.push_back('\n');
    writeAll(s.route.kind == StreamKind::kStdout ? console_out_ : console_err_, line.data(),
             line.size());
  }
}

bool OutputRouter::onReadable(int fd) {
  auto it = streams_.find(fd);
  if (it == streams_.end()) return false;
  Stream& s = it->second;
  char buf[65536];
  while (true) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    if (n <= 0) {
      if (!s.pending.empty()) {
        emitLine(s, s.pending.data(), s.pending.size(), false);
        s.pending.clear();
      }
      return false;
    }
    s.pending.append(buf, static_cast<size_t>(n));
    size_t start = 0;
    for (size_t nl; (nl = s.pending.find('\n', start)) != std::string::npos; start = nl + 1)
      emitLine(s, s.pending.data() + start, nl - start, true);
    s.pending.erase(0, start);
    // A line that never ends must not grow without bound: pass it on in pieces.
    while (s.pending.size() >= kMaxLine) {
      emitLine(s, s.pending.data(), kMaxLine, false);
      s.pending.erase(0, kMaxLine);
    }
  }
}

void OutputRouter::remove(int fd) {
  auto it = streams_.find(fd);
  if (it == streams_.end()) return;
  if (it->second.route.file_fd >= 0) close(it->second.route.file_fd);
  streams_.erase(it);
  close(fd);
}

std::deque<std::string> OutputRouter::stderrTail(int local_rank) const {
  auto it = stderr_tail_.find(local_rank);
  return it == stderr_tail_.end() ? std::deque<std::string>{} : it->second;
}

}  // namespace ddpl::launcher
