#pragma once
// Routes worker stdout/stderr to the console (prefixed as torchrun does, "[role local_rank]:",
// whole lines only, so lines of different workers never interleave mid-line) and to per-rank
// log files. Carriage-return updates (progress bars) are shown live on a terminal console,
// on one status line that other workers' lines scroll past; files get each line's final state.
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "common/file_io.h"

namespace ddpl::launcher {

enum class StreamKind { kStdout, kStderr };

struct StreamRoute {
  int local_rank = 0;
  int global_rank = 0;
  StreamKind kind = StreamKind::kStdout;
  bool to_console = true;
  int file_fd = -1;  // owned by the router once added; -1: no file
};

struct ConsoleOptions {
  int out = 1;  // where console lines go
  int err = 2;
  std::string role = "default";
  // ${role_name}, ${local_rank}, ${rank} (also $name), as torchrun's
  // TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE; empty or prefix=false: no prefix.
  std::string prefix_template = "[${role_name}${local_rank}]:";
  bool prefix = true;
  // Both consoles are one terminal: show '\r' updates as they come (else final states only),
  // and launch's own status line (setStatus) below them.
  bool live = false;
  // The terminal's width, for lines kept at the bottom (cut, never wrapped: a wrapped line
  // could not be redrawn in place). 0: ask the terminal (TIOCGWINSZ) each time.
  size_t columns = 0;
  // Keep launch's status line (setStatus) at the bottom: on a terminal (live), or forced.
  bool status_line = false;
  // torchrun's --duplicate-stdout-filters/--duplicate-stderr-filters: a tee'd line (its stream
  // goes both to a file and to the console, which is what tee means: --local-ranks-filter
  // leaves out the same ranks torchrun's does) holding any of these strings is also written,
  // prefixed even under --no-prefix, to the attempt's file (openDuplicateFiles).
  std::vector<std::string> duplicate_stdout_filters;
  std::vector<std::string> duplicate_stderr_filters;
};

// This machine's name as gethostname() gives it (torchrun's socket.gethostname()).
std::string nodeName();

// torchrun's Template.safe_substitute over ${role_name}, ${local_rank}, ${rank} and
// ${hostname}; unknown $names stay as written.
std::string expandPrefix(const std::string& tmpl, const std::string& role, int local_rank,
                         int global_rank, const std::string& hostname = nodeName());

class OutputRouter {
 public:
  explicit OutputRouter(ConsoleOptions console);
  ~OutputRouter();
  OutputRouter(const OutputRouter&) = delete;
  OutputRouter& operator=(const OutputRouter&) = delete;

  void add(int fd, const StreamRoute& route);

  // Reads what is available. Returns false at EOF or error, after flushing a trailing partial
  // line; the caller then removes the fd (remove() closes it).
  bool onReadable(int fd);
  void remove(int fd);
  // Reads whatever is left without blocking (a worker exited; grandchildren may hold the pipe).
  void drain(int fd) { onReadable(fd); }

  // Last lines a worker wrote to stderr, for the failure report when it left no error file.
  std::deque<std::string> stderrTail(int local_rank) const;
  void clearTails() {
    stderr_tail_.clear();
    bytes_.clear();
  }
  // Keep each local rank's last kRecentLines lines of output, both streams, for the dashboard
  // (off by default: a copy of every line otherwise nobody reads).
  void keepRecentLines(bool keep) { keep_recent_ = keep; }
  // Those lines, oldest first, each cut to kMaxRecentLine bytes. Safe from any thread.
  std::vector<std::string> recentLines(int local_rank) const;
  std::string lastLine(int local_rank) const;

  // launch's status line, kept below every worker line on a live console (nothing otherwise);
  // empty: none. Safe from any thread.
  void setStatus(const std::string& text);
  // Runs `write` (a line of launch's own log on the terminal) with the bottom lines taken
  // away and drawn again after it, so that they stay at the bottom. Safe from any thread.
  void aroundConsoleWrite(const std::function<void()>& write);

  // Creates filtered_stdout.log and filtered_stderr.log in `attempt_dir` for the streams that
  // have filters (none: no file), as torchrun does for each attempt, and closes the last
  // attempt's. Throws Error when one cannot be created.
  void openDuplicateFiles(const std::string& attempt_dir);

  // Bytes read so far from a local rank's streams (output as a sign of progress).
  uint64_t bytesFrom(int local_rank) const {
    auto it = bytes_.find(local_rank);
    return it == bytes_.end() ? 0 : it->second;
  }

  static constexpr size_t kMaxLine = 64 * 1024;
  static constexpr size_t kTailLines = 20;
  static constexpr size_t kRecentLines = 200;
  static constexpr size_t kMaxRecentLine = 512;

 private:
  struct Stream {
    StreamRoute route;
    std::string prefix;
    std::string pending;      // text since the last '\n'
    std::string file_prefix;  // the prefix in the filtered file, whatever --no-prefix says
  };
  void emitLine(Stream& s, const char* data, size_t len, bool newline_present);
  void duplicate(const Stream& s, const std::string& text);
  void showLive(int fd, Stream& s);
  void consoleWrite(int console_fd, const std::string& text);
  // The lines kept at the bottom of a live console: the worker line being updated with '\r'
  // (if any), then launch's status line (if any). eraseBottom() returns what takes them
  // away (the cursor ends at the start of the first), drawBottom() what draws them again
  // (the cursor ends after the last, no newline). Callers hold console_mu_.
  std::string eraseBottom();
  std::string drawBottom();
  void dropLive(int fd);  // the stream that owned the updated line is gone
  size_t width() const;
  int consoleFor(const Stream& s) const {
    return s.route.kind == StreamKind::kStdout ? console_.out : console_.err;
  }

  ConsoleOptions console_;
  std::map<int, Stream> streams_;
  int duplicate_fd_[2] = {-1, -1};  // filtered_stdout.log, filtered_stderr.log; -1: none
  std::string hostname_;            // ${hostname}, asked once
  std::map<int, std::deque<std::string>> stderr_tail_;
  bool keep_recent_ = false;
  mutable std::mutex recent_mu_;
  std::map<int, std::deque<std::string>> recent_;  // guarded by recent_mu_
  std::map<int, uint64_t> bytes_;
  // The one worker line on a live console that '\r' updates: which stream owns it and what
  // it shows.
  int live_owner_ = -1;
  std::string live_text_;
  std::string status_;       // launch's own line
  size_t bottom_lines_ = 0;  // how many lines are drawn at the bottom now
  // Worker lines come from the agent's loop, log lines and the status from any thread.
  mutable std::recursive_mutex console_mu_;
};

// write(2) until done (common/file_io.h). Callers here ignore its error: a closed console
// (EPIPE) must never stop supervision.
using ddpl::writeAll;

}  // namespace ddpl::launcher
