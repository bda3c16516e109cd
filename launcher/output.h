#pragma once
// Routes worker stdout/stderr to the console (prefixed "[role rank]:", whole lines only, so
// lines of different workers never interleave mid-line) and to per-rank log files.
#include <deque>
#include <map>
#include <string>

namespace ddpl::launcher {

enum class StreamKind { kStdout, kStderr };

struct StreamRoute {
  int local_rank = 0;
  int global_rank = 0;
  StreamKind kind = StreamKind::kStdout;
  bool to_console = true;
  int file_fd = -1;  // owned by the router once added; -1: no file
};

class OutputRouter {
 public:
  // console_out/err: where console lines go (normally 1 and 2).
  OutputRouter(std::string role, int console_out, int console_err);
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
  void clearTails() { stderr_tail_.clear(); }

  static constexpr size_t kMaxLine = 64 * 1024;
  static constexpr size_t kTailLines = 20;

 private:
  struct Stream {
    StreamRoute route;
    std::string pending;
  };
  void emitLine(Stream& s, const char* data, size_t len, bool newline_present);

  std::string role_;
  int console_out_, console_err_;
  std::map<int, Stream> streams_;
  std::map<int, std::deque<std::string>> stderr_tail_;
};

// write(2) until done; gives up silently on a closed console (EPIPE) so that a vanished
// terminal never stops supervision.
void writeAll(int fd, const char* data, size_t len);

}  // namespace ddpl::launcher
