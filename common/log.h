#pragma once
// The one logging facade over spdlog. Every line carries host, role and rank, set once at
// start-up; the level is chosen at run time. Libraries log through this, never to std::cerr.
#include <spdlog/spdlog.h>

#include <chrono>
#include <functional>
#include <mutex>
#include <string>

namespace ddpl::log {

struct Identity {
  std::string role = "ddpl";  // "launch", "rdzv-server", "worker", ...
  int rank = -1;              // -1: not a rank (agent or server)
  std::string host;           // empty: this machine's short hostname
};

// Installs the process-wide logger writing to stderr. Safe to call again to change identity
// (for example once a worker learns its rank).
void init(const Identity& identity, spdlog::level::level_enum level = spdlog::level::info);

// Parses "trace|debug|info|warn|error|critical|off"; throws ddpl::InvalidArgument otherwise.
spdlog::level::level_enum parseLevel(const std::string& name);

void setLevel(spdlog::level::level_enum level);

// Runs a write of one log line to stderr. Set by a program that keeps lines of its own at the
// bottom of the terminal (launch's live status line): it takes them away, calls the write and
// draws them again. Empty: lines are written as they are.
using ConsoleWrapper = std::function<void(const std::function<void()>& write)>;
void setConsoleWrapper(ConsoleWrapper wrapper);
// Runs `write` as a log line's write: through the console wrapper when one is set. (A plugin
// with its own copy of this facade sends its lines through the program's this way.)
void writeThroughConsole(const std::function<void()>& write);

spdlog::logger& logger();

// Lets one line of a kind through per `interval`, for lines a peer can provoke at any rate.
// admit() says whether this one goes out and, when it does, how many were held back since
// the last one that did (to be said with it). Thread-safe.
class Limiter {
 public:
  explicit Limiter(std::chrono::steady_clock::duration interval) : interval_(interval) {}
  bool admit(int64_t* held_back) {
    std::lock_guard<std::mutex> lock(mu_);
    auto now = std::chrono::steady_clock::now();
    if (last_ != std::chrono::steady_clock::time_point{} && now - last_ < interval_) {
      ++held_;
      return false;
    }
    last_ = now;
    *held_back = held_;
    held_ = 0;
    return true;
  }

 private:
  std::mutex mu_;
  std::chrono::steady_clock::duration interval_;
  std::chrono::steady_clock::time_point last_{};
  int64_t held_ = 0;
};

std::string hostname();

template <typename... Args>
void trace(spdlog::format_string_t<Args...> fmt, Args&&... args) {
  logger().trace(fmt, std::forward<Args>(args)...);
}
template <typename... Args>
void debug(spdlog::format_string_t<Args...> fmt, Args&&... args) {
  logger().debug(fmt, std::forward<Args>(args)...);
}
template <typename... Args>
void info(spdlog::format_string_t<Args...> fmt, Args&&... args) {
  logger().info(fmt, std::forward<Args>(args)...);
}
template <typename... Args>
void warn(spdlog::format_string_t<Args...> fmt, Args&&... args) {
  logger().warn(fmt, std::forward<Args>(args)...);
}
template <typename... Args>
void error(spdlog::format_string_t<Args...> fmt, Args&&... args) {
  logger().error(fmt, std::forward<Args>(args)...);
}

}  // namespace ddpl::log
