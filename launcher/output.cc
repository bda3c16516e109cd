#include "launcher/output.h"

#include <unistd.h>

#include <cerrno>

namespace ddpl::launcher {
namespace {

// What a line shows once written out: the text after its last carriage return (a CR just
// before the newline is a DOS line end, not an overwrite).
std::string finalState(const char* data, size_t len) {
  if (len > 0 && data[len - 1] == '\r') --len;
  std::string_view line(data, len);
  auto cr = line.rfind('\r');
  return std::string(cr == std::string_view::npos ? line : line.substr(cr + 1));
}

constexpr char kClearLine[] = "\r\x1b[K";

}  // namespace

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

std::string expandPrefix(const std::string& tmpl, const std::string& role, int local_rank,
                         int global_rank) {
  const std::pair<std::string, std::string> vars[] = {{"role_name", role},
                                                      {"local_rank", std::to_string(local_rank)},
                                                      {"rank", std::to_string(global_rank)}};
  std::string out;
  for (size_t i = 0; i < tmpl.size();) {
    if (tmpl[i] == '$' && i + 1 < tmpl.size() && tmpl[i + 1] == '$') {
      out.push_back('$');
      i += 2;
      continue;
    }
    bool done = false;
    if (tmpl[i] == '$') {
      for (const auto& [name, value] : vars) {
        std::string braced = "${" + name + "}";
        if (tmpl.compare(i, braced.size(), braced) == 0) {
          out += value;
          i += braced.size();
          done = true;
          break;
        }
        // $name only when not followed by more identifier characters ($rankX is not $rank).
        size_t end = i + 1 + name.size();
        if (tmpl.compare(i + 1, name.size(), name) == 0 &&
            (end >= tmpl.size() ||
             !(isalnum(static_cast<unsigned char>(tmpl[end])) || tmpl[end] == '_'))) {
          out += value;
          i = end;
          done = true;
          break;
        }
      }
    }
    if (!done) out.push_back(tmpl[i++]);
  }
  return out;
}

OutputRouter::OutputRouter(ConsoleOptions console) : console_(std::move(console)) {}

OutputRouter::~OutputRouter() {
  for (auto& [fd, s] : streams_) {
    if (!s.pending.empty()) emitLine(s, s.pending.data(), s.pending.size(), false);
    if (s.route.file_fd >= 0) close(s.route.file_fd);
    close(fd);
  }
}

void OutputRouter::add(int fd, const StreamRoute& route) {
  std::string prefix = console_.prefix ? expandPrefix(console_.prefix_template, console_.role,
                                                      route.local_rank, route.global_rank)
                                       : "";
  streams_[fd] = Stream{route, std::move(prefix), {}};
}

void OutputRouter::consoleWrite(int console_fd, const std::string& text) {
  if (live_owner_ < 0) {
    writeAll(console_fd, text.data(), text.size());
    return;
  }
  // Other lines scroll above the status line: clear it, write, then draw it again below. Both
  // consoles are one terminal in live mode, so a line on either clears it.
  std::string out = kClearLine + text;
  if (console_fd == live_console_) out += live_text_;
  writeAll(console_fd, out.data(), out.size());
  if (console_fd != live_console_) writeAll(live_console_, live_text_.data(), live_text_.size());
}

void OutputRouter::emitLine(Stream& s, const char* data, size_t len, bool newline_present) {
  std::string text = finalState(data, len);
  if (s.route.file_fd >= 0) {
    writeAll(s.route.file_fd, text.data(), text.size());
    if (newline_present) writeAll(s.route.file_fd, "\n", 1);
  }
  if (s.route.kind == StreamKind::kStderr) {
    auto& tail = stderr_tail_[s.route.local_rank];
    tail.push_back(text);
    if (tail.size() > kTailLines) tail.pop_front();
  }
  if (!s.route.to_console) return;
  int console = consoleFor(s);
  // This stream's status line becomes an ordinary line: it ends where it stands.
  auto owner = streams_.find(live_owner_);
  if (owner != streams_.end() && &owner->second == &s) {
    live_owner_ = -1;
    std::string line = kClearLine + s.prefix + text + "\n";
    writeAll(console, line.data(), line.size());
    return;
  }
  // One write per line: the console sees whole lines from each worker.
  consoleWrite(console, s.prefix + text + "\n");
}

void OutputRouter::showLive(int fd, Stream& s) {
  if (!console_.live || !s.route.to_console) return;
  auto cr = s.pending.rfind('\r');
  if (cr == std::string::npos) return;
  int console = consoleFor(s);
  live_owner_ = fd;
  live_console_ = console;
  live_text_ = s.prefix + s.pending.substr(cr + 1);
  std::string out = kClearLine + live_text_;
  writeAll(console, out.data(), out.size());
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
    if (n <= 0) {  // EOF, or EIO from a terminal whose other side closed
      if (!s.pending.empty()) {
        emitLine(s, s.pending.data(), s.pending.size(), false);
        s.pending.clear();
      }
      if (live_owner_ == fd) live_owner_ = -1;
      return false;
    }
    bytes_[s.route.local_rank] += static_cast<uint64_t>(n);
    s.pending.append(buf, static_cast<size_t>(n));
    size_t start = 0;
    for (size_t nl; (nl = s.pending.find('\n', start)) != std::string::npos; start = nl + 1)
      emitLine(s, s.pending.data() + start, nl - start, true);
    s.pending.erase(0, start);
    // Only the latest carriage-return update of an unfinished line matters.
    if (auto cr = s.pending.rfind('\r'); cr != std::string::npos && cr > 0) {
      s.pending.erase(0, cr);
    }
    showLive(fd, s);
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
  if (live_owner_ == fd) live_owner_ = -1;
  if (it->second.route.file_fd >= 0) close(it->second.route.file_fd);
  streams_.erase(it);
  close(fd);
}

std::deque<std::string> OutputRouter::stderrTail(int local_rank) const {
  auto it = stderr_tail_.find(local_rank);
  return it == stderr_tail_.end() ? std::deque<std::string>{} : it->second;
}

}  // namespace ddpl::launcher
