#include "launcher/agent/output.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/errors.h"
#include "launcher/health/job_view.h"

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
constexpr char kLineUp[] = "\x1b[1A";

}  // namespace

std::string nodeName() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

std::string expandPrefix(const std::string& tmpl, const std::string& role, int local_rank,
                         int global_rank, const std::string& hostname) {
  const std::pair<std::string, std::string> vars[] = {{"role_name", role},
                                                      {"local_rank", std::to_string(local_rank)},
                                                      {"rank", std::to_string(global_rank)},
                                                      {"hostname", hostname}};
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

OutputRouter::OutputRouter(ConsoleOptions console)
    : console_(std::move(console)), hostname_(nodeName()) {}

OutputRouter::~OutputRouter() {
  for (auto& [fd, s] : streams_) {
    if (!s.pending.empty()) emitLine(s, s.pending.data(), s.pending.size(), false);
    if (s.route.file_fd >= 0) close(s.route.file_fd);
    close(fd);
  }
  for (int dup : duplicate_fd_)
    if (dup >= 0) close(dup);
}

void OutputRouter::add(int fd, const StreamRoute& route) {
  std::string file_prefix = expandPrefix(console_.prefix_template, console_.role, route.local_rank,
                                         route.global_rank, hostname_);
  std::string prefix = console_.prefix ? file_prefix : "";
  streams_[fd] = Stream{route, std::move(prefix), {}, std::move(file_prefix)};
}

void OutputRouter::openDuplicateFiles(const std::string& attempt_dir) {
  const std::vector<std::string>* filters[] = {&console_.duplicate_stdout_filters,
                                               &console_.duplicate_stderr_filters};
  const char* names[] = {"/filtered_stdout.log", "/filtered_stderr.log"};
  for (int i = 0; i < 2; ++i) {
    if (duplicate_fd_[i] >= 0) close(duplicate_fd_[i]);
    duplicate_fd_[i] = -1;
    if (filters[i]->empty()) continue;
    std::string path = attempt_dir + names[i];
    // The attempt's directory is launch's own and private; never follow a planted link.
    int fd =
        open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0640);
    if (fd < 0) throw Error("cannot create '" + path + "': " + std::strerror(errno));
    duplicate_fd_[i] = fd;
  }
}

void OutputRouter::duplicate(const Stream& s, const std::string& text) {
  const bool out = s.route.kind == StreamKind::kStdout;
  int fd = duplicate_fd_[out ? 0 : 1];
  if (fd < 0) return;
  const auto& needles = out ? console_.duplicate_stdout_filters : console_.duplicate_stderr_filters;
  // torchrun's test: any needle is a substring of the line.
  if (std::none_of(needles.begin(), needles.end(),
                   [&](const std::string& n) { return text.find(n) != std::string::npos; }))
    return;
  std::string line = s.file_prefix + text + "\n";
  writeAll(fd, line.data(), line.size());
}

size_t OutputRouter::width() const {
  if (console_.columns > 0) return console_.columns;
  winsize ws{};
  if (ioctl(console_.err, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  return 80;
}

std::string OutputRouter::eraseBottom() {
  if (bottom_lines_ == 0) return kClearLine;  // whatever the cursor's line holds
  std::string out;
  for (size_t i = 0; i < bottom_lines_; ++i)
    out += (i == 0 ? "" : kLineUp) + std::string(kClearLine);
  bottom_lines_ = 0;
  return out;
}

std::string OutputRouter::drawBottom() {
  // One column short of the width: a line that fills the last column leaves some terminals'
  // cursor pending a wrap, and the next redraw would then clear the wrong line.
  size_t cols = std::max<size_t>(width(), 2) - 1;
  std::string out;
  if (live_owner_ >= 0) {
    out += fitColumns(live_text_, cols);
    ++bottom_lines_;
  }
  if (!status_.empty()) {
    if (bottom_lines_ > 0) out += "\n";
    out += fitColumns(status_, cols);
    ++bottom_lines_;
  }
  return out;
}

void OutputRouter::consoleWrite(int console_fd, const std::string& text) {
  std::lock_guard<std::recursive_mutex> lock(console_mu_);
  if (bottom_lines_ == 0 && live_owner_ < 0 && status_.empty()) {
    writeAll(console_fd, text.data(), text.size());
    return;
  }
  // Other lines scroll above the bottom lines: take them away, write, then draw them again.
  // Both consoles are one terminal in live mode.
  std::string out = eraseBottom();
  out += text;
  out += drawBottom();
  writeAll(console_fd, out.data(), out.size());
}

void OutputRouter::setStatus(const std::string& text) {
  if (!console_.status_line) return;
  std::lock_guard<std::recursive_mutex> lock(console_mu_);
  if (text == status_) return;
  status_ = text;
  std::string out = eraseBottom();
  out += drawBottom();
  writeAll(console_.err, out.data(), out.size());
}

void OutputRouter::aroundConsoleWrite(const std::function<void()>& write) {
  std::lock_guard<std::recursive_mutex> lock(console_mu_);
  if (bottom_lines_ == 0) {
    write();
    return;
  }
  std::string erase = eraseBottom();
  writeAll(console_.err, erase.data(), erase.size());
  write();
  std::string draw = drawBottom();
  writeAll(console_.err, draw.data(), draw.size());
}

void OutputRouter::emitLine(Stream& s, const char* data, size_t len, bool newline_present) {
  std::string text = finalState(data, len);
  if (s.route.file_fd >= 0) {
    writeAll(s.route.file_fd, text.data(), text.size());
    if (newline_present) writeAll(s.route.file_fd, "\n", 1);
    if (s.route.to_console) duplicate(s, text);  // tee'd: to a file and to the console
  }
  if (keep_recent_) {
    std::string kept = text.size() > kMaxRecentLine ? text.substr(0, kMaxRecentLine) : text;
    std::lock_guard<std::mutex> lock(recent_mu_);
    auto& recent = recent_[s.route.local_rank];
    recent.push_back(std::move(kept));
    if (recent.size() > kRecentLines) recent.pop_front();
  }
  if (s.route.kind == StreamKind::kStderr) {
    auto& tail = stderr_tail_[s.route.local_rank];
    tail.push_back(text);
    if (tail.size() > kTailLines) tail.pop_front();
  }
  if (!s.route.to_console) return;
  int console = consoleFor(s);
  std::lock_guard<std::recursive_mutex> lock(console_mu_);
  // This stream's updated line becomes an ordinary line, above the status line.
  auto owner = streams_.find(live_owner_);
  if (owner != streams_.end() && &owner->second == &s) {
    std::string out = eraseBottom();
    live_owner_ = -1;
    out += s.prefix + text + "\n";
    out += drawBottom();
    writeAll(console, out.data(), out.size());
    return;
  }
  // One write per line: the console sees whole lines from each worker.
  consoleWrite(console, s.prefix + text + "\n");
}

std::vector<std::string> OutputRouter::recentLines(int local_rank) const {
  std::lock_guard<std::mutex> lock(recent_mu_);
  auto it = recent_.find(local_rank);
  if (it == recent_.end()) return {};
  return {it->second.begin(), it->second.end()};
}

std::string OutputRouter::lastLine(int local_rank) const {
  std::lock_guard<std::mutex> lock(recent_mu_);
  auto it = recent_.find(local_rank);
  return it == recent_.end() || it->second.empty() ? "" : it->second.back();
}

void OutputRouter::showLive(int fd, Stream& s) {
  if (!console_.live || !s.route.to_console) return;
  auto cr = s.pending.rfind('\r');
  if (cr == std::string::npos) return;
  int console = consoleFor(s);
  std::lock_guard<std::recursive_mutex> lock(console_mu_);
  std::string out = eraseBottom();
  live_owner_ = fd;
  live_text_ = s.prefix + s.pending.substr(cr + 1);
  out += drawBottom();
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
      dropLive(fd);
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
  dropLive(fd);
  if (it->second.route.file_fd >= 0) close(it->second.route.file_fd);
  streams_.erase(it);
  close(fd);
}

void OutputRouter::dropLive(int fd) {
  std::lock_guard<std::recursive_mutex> lock(console_mu_);
  if (live_owner_ != fd) return;
  // Its unfinished line was written out as an ordinary one; the bottom keeps the status only.
  std::string out = eraseBottom();
  live_owner_ = -1;
  out += drawBottom();
  writeAll(console_.err, out.data(), out.size());
}

std::deque<std::string> OutputRouter::stderrTail(int local_rank) const {
  auto it = stderr_tail_.find(local_rank);
  return it == stderr_tail_.end() ? std::deque<std::string>{} : it->second;
}

}  // namespace ddpl::launcher
