#include "worker/error_report.h"

#include <c10/util/Backtrace.h>
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

}  // namespace

ErrorRecord describeException(const std::exception_ptr& error) {
  ErrorRecord record;
  record.timestamp = unixSeconds();
  try {
    std::rethrow_exception(error);
  } catch (const c10::Error& e) {
    // LibTorch captured the frames where it threw; that is the useful backtrace.
    record.type = demangle(typeid(e).name());
    record.message = e.msg();
    record.backtrace = e.backtrace() ? e.backtrace()->get() : c10::get_backtrace(1);
  } catch (const std::exception& e) {
    record.type = demangle(typeid(e).name());
    record.message = e.what();
    // The throw site is unwound by now; these are the frames of the reporting site.
    record.backtrace = c10::get_backtrace(1);
  } catch (...) {
    const std::type_info* type = abi::__cxa_current_exception_type();
    record.type = type ? demangle(type->name()) : "unknown";
    record.message = "(not a std::exception)";
    record.backtrace = c10::get_backtrace(1);
  }
  return record;
}

std::string errorFileJson(const ErrorRecord& record) {
  nlohmann::json json;
  json["message"]["message"] = record.type + ": " + record.message;
  json["message"]["extraInfo"]["py_callstack"] = record.backtrace;
  json["message"]["extraInfo"]["timestamp"] = std::to_string(record.timestamp);
  return json.dump(2);
}

void writeErrorFile(const std::string& path, const ErrorRecord& record) {
  if (path.empty()) return;
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const std::string text = errorFileJson(record);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    wlog::error("cannot write error file " + path + ": " + std::strerror(errno));
    return;
  }
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  ::fsync(fd);
  ::close(fd);
  if (done != text.size() || std::rename(tmp.c_str(), path.c_str()) != 0) {
    wlog::error("cannot write error file " + path);
    ::unlink(tmp.c_str());
  }
}

namespace {
std::string& terminateErrorFile() {
  static std::string path;
  return path;
}

[[noreturn]] void onTerminate() {
  // An exception escaped a thread (or a noexcept frame): the stack is still intact here.
  if (auto error = std::current_exception()) {
    ErrorRecord record = describeException(error);
    record.backtrace = c10::get_backtrace(1) + "\n(thrown at)\n" + record.backtrace;
    wlog::error("terminating on uncaught " + record.type + ": " + record.message);
    writeErrorFile(terminateErrorFile(), record);
  }
  wlog::flush();
  std::_Exit(1);
}
}  // namespace

int recordErrors(const std::string& errorFile, const std::function<int()>& body) {
  terminateErrorFile() = errorFile;
  std::set_terminate(onTerminate);
  try {
    return body();
  } catch (...) {
    const ErrorRecord record = describeException(std::current_exception());
    wlog::error(record.type + ": " + record.message);
    writeErrorFile(errorFile, record);
    wlog::flush();
    return 1;
  }
}

}  // namespace ddpl::worker
