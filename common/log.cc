#include "common/log.h"

#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <unistd.h>

#include <atomic>
#include <mutex>

#include "common/errors.h"

namespace ddpl::log {
namespace {

std::mutex g_mu;
// Never freed, nor are the loggers init() replaces: threads we do not own (gRPC's, torch's) may
// log while static destructors run at exit, or hold a reference across a re-init.
std::shared_ptr<spdlog::logger>* g_logger = nullptr;

// The wrapper of setConsoleWrapper. One object for the process's life (never freed, like the
// loggers, for the same reason), replaced in place under the lock: a line being written runs
// its own copy.
std::mutex g_wrap_mu;
ConsoleWrapper* g_wrapper = new ConsoleWrapper();

// stderr, with each line passed through the console wrapper when one is set.
class WrappedStderrSink : public spdlog::sinks::base_sink<std::mutex> {
 public:
  WrappedStderrSink()
      : inner_(std::make_shared<spdlog::sinks::stderr_color_sink_st>(
            spdlog::color_mode::automatic)) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    writeThroughConsole([&] {
      inner_->log(msg);
      inner_->flush();
    });
  }
  void flush_() override { inner_->flush(); }
  void set_pattern_(const std::string& pattern) override { inner_->set_pattern(pattern); }
  void set_formatter_(std::unique_ptr<spdlog::formatter> f) override {
    inner_->set_formatter(std::move(f));
  }

 private:
  std::shared_ptr<spdlog::sinks::stderr_color_sink_st> inner_;
};

std::shared_ptr<spdlog::logger> makeLogger(const Identity& id, spdlog::level::level_enum level) {
  auto sink = std::make_shared<WrappedStderrSink>();
  auto lg = std::make_shared<spdlog::logger>("ddpl", sink);
  std::string host = id.host.empty() ? hostname() : id.host;
  std::string who = id.rank >= 0 ? id.role + " rank " + std::to_string(id.rank) : id.role;
  // Braces in names would be read as format fields by spdlog's pattern: none are allowed in
  // host names or roles, so the plain concatenation is safe.
  lg->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [" + host + " " + who + "] [%^%l%$] %v");
  lg->set_level(level);
  lg->flush_on(spdlog::level::warn);
  return lg;
}

}  // namespace

std::string hostname() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  std::string h(buf);
  auto dot = h.find('.');
  return dot == std::string::npos ? h : h.substr(0, dot);
}

void init(const Identity& identity, spdlog::level::level_enum level) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_logger = new std::shared_ptr<spdlog::logger>(makeLogger(identity, level));
}

spdlog::level::level_enum parseLevel(const std::string& name) {
  static const char* kNames[] = {"trace", "debug", "info", "warn", "error", "critical", "off"};
  for (int i = 0; i < 7; ++i) {
    if (name == kNames[i]) return static_cast<spdlog::level::level_enum>(i);
  }
  if (name == "warning") return spdlog::level::warn;
  throw InvalidArgument("unknown log level '" + name +
                        "': use trace, debug, info, warn, error, critical or off");
}

void setConsoleWrapper(ConsoleWrapper wrapper) {
  std::lock_guard<std::mutex> lock(g_wrap_mu);
  *g_wrapper = std::move(wrapper);
}

void writeThroughConsole(const std::function<void()>& write) {
  ConsoleWrapper wrap;
  {
    std::lock_guard<std::mutex> lock(g_wrap_mu);
    wrap = *g_wrapper;
  }
  if (wrap)
    wrap(write);
  else
    write();
}

void setLevel(spdlog::level::level_enum level) { logger().set_level(level); }

spdlog::logger& logger() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_logger) g_logger = new std::shared_ptr<spdlog::logger>(makeLogger(Identity{}, spdlog::level::info));
  return **g_logger;
}

}  // namespace ddpl::log
