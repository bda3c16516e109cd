#include "worker/error_report.h"

#include <c10/util/Exception.h>
#include <cxxabi.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <typeinfo>

#include "common/file_io.h"
#include "worker/log_bridge.h"

namespace ddpl::worker {
namespace {

std::string demangle(const char* name) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> out(abi::__cxa_demangle(name, nullptr, nullptr, &status),
                                             std::free);
  return status == 0 && out ? std::string(out.get()) : std::string(name);
}

long unixSeconds() {
  return static_cast<long>(std::chrono::duration_cast<std::chrono::seconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count());
}

// Where the frames come from when the exception brings none and its throw went unrecorded
// (worker/throw_stack.cc). Caught and reported, an exception has unwound the frames of its
// throw; escaped from a thread, it has not (nothing caught it).
enum class StackAtReport { kThrowUnwound, kThrowOnStack };

const char kThrowHeader[] = "Thrown from (most recent call first):\n";

// The frames of the throw, as recorded when the exception was made; empty when none were.
std::string throwTrace(const std::exception_ptr& error, const NativeTraceOptions& options) {
  std::vector<uintptr_t> frames = throwStackOf(error);
  if (frames.empty()) return "";
  if (frames.size() > options.max_frames) frames.resize(options.max_frames);
  return kThrowHeader + formatTrace(symbolize(frames, options));
}

// Not inlined: it is the innermost frame of its own trace, and the launcher's report knows it by
// name (launcher/agent/error_report.cc) to leave it out.
__attribute__((noinline)) ErrorRecord describeImpl(const std::exception_ptr& error,
                                                   const NativeTraceOptions& trace,
                                                   StackAtReport stack) {
  ErrorRecord record;
  record.timestamp = unixSeconds();
  // For exceptions that bring no frames of their own and whose throw was not recorded: this
  // stack.
  const std::string ownHeader =
      stack == StackAtReport::kThrowOnStack
          ? "Uncaught, in the thread that threw it (most recent call first):\n"
          : "Reported from (the frames of the throw are unwound by then; most recent call "
            "first):\n";
  try {
    std::rethrow_exception(error);
  } catch (const c10::Error& e) {
    // LibTorch captured the frames where it threw; that is the useful backtrace. Only its text
    // is reachable, and its lines carry each frame's address: symbolised from those.
    record.type = demangle(typeid(e).name());
    record.message = e.msg();
    if (e.backtrace()) record.backtrace = symbolizeBacktraceText(e.backtrace()->get(), trace);
  } catch (const std::exception& e) {
    record.type = demangle(typeid(e).name());
    record.message = e.what();
  } catch (...) {
    const std::type_info* type = abi::__cxa_current_exception_type();
    record.type = type ? demangle(type->name()) : "unknown";
    record.message = "(not a std::exception)";
  }
  if (record.backtrace.empty()) record.backtrace = throwTrace(error, trace);
  if (record.backtrace.empty()) record.backtrace = ownHeader + currentTrace(0, trace);
  return record;
}

}  // namespace

ErrorRecord describeException(const std::exception_ptr& error, const NativeTraceOptions& trace) {
  return describeImpl(error, trace, StackAtReport::kThrowUnwound);
}

std::string errorFileJson(const ErrorRecord& record) {
  nlohmann::json json;
  json["message"]["message"] = record.type + ": " + record.message;
  json["message"]["extraInfo"]["py_callstack"] = record.backtrace;
  json["message"]["extraInfo"]["timestamp"] = std::to_string(record.timestamp);
  // Messages and paths are bytes: invalid UTF-8 must not turn the report into a second error.
  return json.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

void writeErrorFile(const std::string& path, const ErrorRecord& record) {
  if (path.empty()) return;
  // Called from the terminate handler too: a file that cannot be written is logged, not thrown.
  try {
    writeFileAtomically(path, errorFileJson(record));
  } catch (const std::exception& e) {
    wlog::error(std::string("error file: ") + e.what());
  }
}

namespace {
ErrorReportOptions& terminateOptions() {
  static ErrorReportOptions options;
  return options;
}

[[noreturn]] void onTerminate() {
  // An exception escaped a thread (nothing caught it, so nothing was unwound: the frames here
  // run down to the throw) or a noexcept function (unwound up to that function). A c10::Error
  // brings its own frames from the throw.
  if (auto error = std::current_exception()) {
    const ErrorRecord record =
        describeImpl(error, terminateOptions().trace, StackAtReport::kThrowOnStack);
    wlog::error("terminating on uncaught " + record.type + ": " + record.message);
    writeErrorFile(terminateOptions().error_file, record);
  }
  wlog::flush();
  std::_Exit(1);
}
}  // namespace

int recordErrors(const ErrorReportOptions& options, const std::function<int()>& body) {
  terminateOptions() = options;
  std::set_terminate(onTerminate);
  try {
    return body();
  } catch (...) {
    const ErrorRecord record = describeException(std::current_exception(), options.trace);
    wlog::error(record.type + ": " + record.message);
    writeErrorFile(options.error_file, record);
    wlog::flush();
    return 1;
  }
}

int recordErrors(const std::string& error_file, const std::function<int()>& body) {
  ErrorReportOptions options;
  options.error_file = error_file;
  return recordErrors(options, body);
}

}  // namespace ddpl::worker
