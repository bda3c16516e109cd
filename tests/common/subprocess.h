#pragma once
// Runs a real program for integration tests: argv + extra environment in, exit status and
// captured output out, always bounded by a deadline (the child's process group is SIGKILLed
// when it passes).
#include <sys/types.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace ddpl::testing {

struct RunResult {
  int exit_code = -1;  // shell convention: 128+N for signal N
  bool timed_out = false;
  std::string out;
  std::string err;
  std::string all() const { return out + err; }
};

struct RunOptions {
  std::map<std::string, std::string> env;  // added to (and overriding) the test's environment
  std::vector<std::string> unset_env;
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  std::string cwd;
};

RunResult run(const std::vector<std::string>& argv, const RunOptions& options = {});

// Starts a program in the background (own process group); the caller finishes it with wait().
class Background {
 public:
  Background(const std::vector<std::string>& argv, const RunOptions& options = {});
  ~Background();  // SIGKILLs the group if still running
  pid_t pid() const { return pid_; }
  RunResult wait(std::chrono::milliseconds timeout);
  // Output so far (non-blocking read of what is available).
  std::string outputSoFar();

 private:
  void pump(int timeout_ms);
  pid_t pid_ = -1;
  int out_fd_ = -1, err_fd_ = -1;
  RunResult result_;
  bool done_ = false;
};

// True while the process exists and is not a zombie.
bool processAlive(pid_t pid);
// Its parent's pid, 0 when it is gone.
pid_t parentOf(pid_t pid);

// Waits up to `timeout` for `pred` to hold, checking every 20 ms (tests only).
template <typename Pred>
bool eventually(Pred pred, std::chrono::milliseconds timeout = std::chrono::seconds(20));

std::string readFile(const std::string& path);

// A port on 127.0.0.1 that was free a moment ago and that no other test of this machine will be
// given for 10 minutes (ctest -j): drawn below the ephemeral range, so that port-0 binds never
// land on it, reserved by an O_EXCL file in /tmp/ddpl-test-ports, then checked by a bind.
int freeLoopbackPort();
// A TCP connection to 127.0.0.1:port that sends nothing (an idle or hostile peer); -1 when
// it cannot connect.
int connectLoopback(int port);
// A TCP listener on 127.0.0.1, port 0 (its port in *port): connections complete in the kernel's
// backlog whether or not the test accepts them (a peer that answers nothing, a port in use).
// -1 when it cannot listen.
int listenLoopback(int* port);
// A fresh private directory /tmp/PREFIX-XXXXXX, removed with what it holds when the test
// program exits (DDPL_KEEP_TEST_DIRS=1 keeps it).
std::string makeTempDir(const std::string& prefix);

// The "frame #N: ..." lines of a C++ worker's traceback (worker/native_trace.h), in order.
std::vector<std::string> frameLines(const std::string& trace);

}  // namespace ddpl::testing

#include <thread>
template <typename Pred>
bool ddpl::testing::eventually(Pred pred, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return pred();
}
