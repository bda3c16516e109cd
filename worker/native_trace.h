#pragma once
// Native stack traces that name functions: demangled names, source file:line and inlined calls
// where the module has symbols or DWARF, module + offset where it has neither. Used for the C++
// backtrace in torchrun's error file (worker/error_report.h).
//
// Torch-free on purpose: the symboliser (libdw) stays out of LibTorch translation units and out
// of every public header.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

namespace ddpl::worker {

struct NativeTraceOptions {
  static constexpr std::chrono::milliseconds kDefaultTimeout{5000};
  static constexpr size_t kDefaultMaxFrames = 64;

  // Off: frames keep only what the capture knew (module + offset).
  bool symbolize = true;
  // Cap on symbolising one trace. A program with gigabytes of DWARF must not make an error take
  // minutes: frames not reached by then keep module + offset, and the trace says it was cut.
  std::chrono::milliseconds timeout = kDefaultTimeout;
  size_t max_frames = kDefaultMaxFrames;
};

// Return addresses of the calling thread's stack, innermost first: the first lies in the
// function that calls captureStack, unless `skip` drops that many frames from the inner end.
std::vector<uintptr_t> captureStack(size_t skip,
                                    size_t max_frames = NativeTraceOptions::kDefaultMaxFrames);

// Frames an exception keeps from the stack of its throw: enough to reach the caller's code from
// inside LibTorch's dispatcher, few enough that a throw stays cheap. Recording costs about
// 0.12 us per frame, 5.5 us at most; a throw and catch costs 1 to 10 us by itself
// (worker/throw_stack.cc has the figures).
constexpr size_t kThrowStackFrames = 48;

// How many frames each throw records from now on (kThrowStackFrames at most); 0 records none,
// for a program that throws and catches on a hot path. Returns the previous limit.
size_t setThrowStackFrames(size_t frames);

// Return addresses of the stack where `error` was thrown (its throw expression, or the
// std::make_exception_ptr that made it), innermost first: the first lies in the function that
// threw. Recorded for every exception a program linked with this library makes
// (worker/throw_stack.cc); empty when none was recorded for this one (made by a runtime that is
// not this process's libstdc++, or its record overwritten by a later throw).
std::vector<uintptr_t> throwStackOf(const std::exception_ptr& error);

// Whether this build records throw sites at all: false where the toolchain could not let a
// program define __cxa_allocate_exception (worker/CMakeLists.txt says so at configure time);
// throwStackOf is then always empty and error files name the catch site.
bool throwStacksRecorded();

// One source position: a function and where in it. Several per frame when calls were inlined.
struct FrameLocation {
  std::string function;  // demangled; empty when the debug information names none
  std::string file;      // empty without line information
  int line = 0;
};

struct SymbolizedFrame {
  uintptr_t address = 0;       // as captured: a return address
  std::string module;          // ELF file mapped at the address; empty when none is
  uintptr_t module_offset =
      0;                       // the address as the module numbers it (`addr2line -e module 0x...`)
  std::string symbol;          // demangled symbol-table name; empty when no symbol covers it
  uintptr_t symbol_offset = 0;
  // From DWARF: the innermost inlined function first, the function the code lies in last.
  std::vector<FrameLocation> locations;
  bool resolved = false;  // looked up (false: symbolisation was cut or failed before this frame)
};

struct SymbolizedTrace {
  std::vector<SymbolizedFrame> frames;  // one per address, same order
  std::string note;                     // why frames were left unresolved; empty when none were
};

// Looks each address up in this process's own modules as they are mapped now.
SymbolizedTrace symbolize(const std::vector<uintptr_t>& addresses,
                          const NativeTraceOptions& options = {});

// "frame #N: ns::f(int) at /src/a.cc:12 (/path/module + 0x1f2e)" lines, inlined callers
// indented below their frame, the note (if any) first.
std::string formatTrace(const SymbolizedTrace& trace);

// The calling thread's stack from the function that calls currentTrace (less `skip` frames),
// symbolised and formatted.
std::string currentTrace(size_t skip, const NativeTraceOptions& options = {});

// A backtrace LibTorch formatted ("frame #N: <symbol> + 0xOFF (0xADDR in MODULE)" lines, as
// c10::Error carries) with its frames symbolised; other lines are kept, and so is every frame
// line that cannot be looked up.
std::string symbolizeBacktraceText(const std::string& text, const NativeTraceOptions& options = {});

}  // namespace ddpl::worker
