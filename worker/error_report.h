#pragma once
// torchrun's error file: an uncaught failure becomes TORCHELASTIC_ERROR_FILE in its JSON format
// so that the launcher's failure report shows the real cause, not "error_file: <N/A>".
#include <exception>
#include <functional>
#include <string>

#include "worker/native_trace.h"

namespace ddpl::worker {

struct ErrorRecord {
  std::string type;       // demangled exception type, "c10::Error"
  std::string message;    // what(), without LibTorch's appended backtrace
  std::string backtrace;  // C++ frames, symbolised (worker/native_trace.h)
  long timestamp = 0;     // unix seconds
};

struct ErrorReportOptions {
  std::string error_file;    // TORCHELASTIC_ERROR_FILE; empty: only log
  NativeTraceOptions trace;  // how the C++ frames are named, and how long that may take
};

// The frames are c10::Error's own (where it was thrown) or, for other exceptions, those its throw
// recorded (native_trace.h: throwStackOf); failing both, the caller's, which still holds the throw
// site only in a terminate handler.
ErrorRecord describeException(const std::exception_ptr& error,
                              const NativeTraceOptions& trace = {});

// {"message": {"message": "<Type>: <text>", "extraInfo": {"py_callstack": ..., "timestamp": ...}}}
std::string errorFileJson(const ErrorRecord& record);

// Writes atomically (temporary file, rename). An empty path only logs.
void writeErrorFile(const std::string& path, const ErrorRecord& record);

// Runs body; on an exception writes the error file, logs, and returns 1 (torchrun's
// @record does the same for Python). Destructors inside body (Session cleanup) have run by
// then. Also installs a terminate handler so exceptions escaping other threads are reported.
int recordErrors(const ErrorReportOptions& options, const std::function<int()>& body);
int recordErrors(const std::string& error_file, const std::function<int()>& body);

}  // namespace ddpl::worker
