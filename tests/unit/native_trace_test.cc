// The symboliser behind the C++ frames of error files (worker/native_trace.h, issue 18), on the
// frames of this program, which is built with debug information, and of a library built
// without any (stripped_frames.cc).
#include "worker/native_trace.h"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace dw = ddpl::worker;

extern "C" void ddpl_test_call_through_stripped(void (*fn)(void*), void* arg);

// The frames under test; their lines are found by the marker comments.
namespace ddpl_test {

std::vector<uintptr_t> captured;

__attribute__((noinline)) void captureHere() {
  captured = dw::captureStack(0);  // marker: capture
  asm volatile("");
}

__attribute__((always_inline)) inline void inlinedStep() {
  captureHere();  // marker: inlined call
}

__attribute__((noinline)) void outerStep() {
  inlinedStep();  // marker: outer call
  asm volatile("");
}

__attribute__((noinline)) void throwHere(int value) {
  if (value > 0) throw std::runtime_error("value " + std::to_string(value));  // marker: throw
  asm volatile("");
}

__attribute__((noinline)) void callThrower(int value) {
  throwHere(value);  // marker: call thrower
  asm volatile("");
}

__attribute__((noinline)) std::exception_ptr madeHere() {
  return std::make_exception_ptr(std::runtime_error("made"));  // marker: make
}

}  // namespace ddpl_test

namespace {

const std::string kThisFile = "tests/unit/native_trace_test.cc";

int lineOf(const std::string& marker) {
  std::ifstream in(std::string(DDPL_SOURCE_DIR) + "/" + kThisFile);
  int n = 0;
  for (std::string line; std::getline(in, line);) {
    ++n;
    if (line.find("// marker: " + marker) != std::string::npos) return n;
  }
  ADD_FAILURE() << "no marker '" << marker << "' in " << kThisFile;
  return -1;
}

std::vector<std::string> linesOf(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

bool endsWith(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

std::string ownPath() {
  Dl_info info{};
  EXPECT_NE(::dladdr(reinterpret_cast<void*>(&ddpl_test::outerStep), &info), 0);
  char resolved[4096];
  return ::realpath(info.dli_fname, resolved) ? resolved : info.dli_fname;
}

// The symboliser's helper process is always reaped: the test program has no other children.
void expectNoChildLeft() {
  errno = 0;
  EXPECT_EQ(::waitpid(-1, nullptr, WNOHANG), -1);
  EXPECT_EQ(errno, ECHILD);
}

TEST(NativeTrace, NamesFunctionsSourceLinesAndInlinedCalls) {
  ddpl_test::outerStep();
  const auto trace = dw::symbolize(ddpl_test::captured);
  ASSERT_GE(trace.frames.size(), 3u);
  EXPECT_EQ(trace.note, "");
  const auto& capture = trace.frames[0];
  EXPECT_TRUE(capture.resolved);
  EXPECT_EQ(capture.module, ownPath());
  ASSERT_EQ(capture.locations.size(), 1u);
  EXPECT_EQ(capture.locations[0].function, "ddpl_test::captureHere()");
  EXPECT_TRUE(endsWith(capture.locations[0].file, kThisFile)) << capture.locations[0].file;
  EXPECT_EQ(capture.locations[0].line, lineOf("capture"));

  // inlinedStep has no frame of its own: its call lies in outerStep's code, and DWARF says so.
  const auto& outer = trace.frames[1];
  ASSERT_EQ(outer.locations.size(), 2u);
  EXPECT_EQ(outer.locations[0].function, "ddpl_test::inlinedStep()");
  EXPECT_EQ(outer.locations[0].line, lineOf("inlined call"));
  EXPECT_EQ(outer.locations[1].function, "ddpl_test::outerStep()");
  EXPECT_EQ(outer.locations[1].line, lineOf("outer call"));
  EXPECT_TRUE(endsWith(outer.locations[1].file, kThisFile)) << outer.locations[1].file;
  EXPECT_NE(outer.symbol.find("ddpl_test::outerStep()"), std::string::npos) << outer.symbol;

  const std::string text = dw::formatTrace(trace);
  const std::string frame0 = "frame #0: ddpl_test::captureHere() at ";
  EXPECT_EQ(text.rfind(frame0, 0), 0u) << text;
  EXPECT_NE(
      text.find(kThisFile + ":" + std::to_string(lineOf("capture")) + " (" + ownPath() + " + 0x"),
      std::string::npos)
      << text;
  EXPECT_NE(text.find("\n    inlined into ddpl_test::outerStep() at "), std::string::npos) << text;
  expectNoChildLeft();
}

TEST(NativeTrace, ModuleOffsetIsTheAddressAsTheModuleNumbersIt) {
  ddpl_test::outerStep();
  const auto trace = dw::symbolize(ddpl_test::captured);
  ASSERT_FALSE(trace.frames.empty());
  Dl_info info{};
  ASSERT_NE(::dladdr(reinterpret_cast<void*>(&ddpl_test::captureHere), &info), 0);
  // A position-independent program: its own numbering starts at its load address.
  EXPECT_EQ(trace.frames[0].module_offset,
            trace.frames[0].address - reinterpret_cast<uintptr_t>(info.dli_fbase));
}

// A library without symbols or DWARF: its hidden function keeps module + offset, its exported
// entry point is named from the dynamic symbol table.
TEST(NativeTrace, StrippedLibraryKeepsModuleAndOffset) {
  ddpl_test_call_through_stripped([](void*) { ddpl_test::outerStep(); }, nullptr);
  const auto lines = linesOf(dw::formatTrace(dw::symbolize(ddpl_test::captured)));
  const std::regex hidden(
      R"(frame #\d+: <unknown function> \(/\S+/libddpl_test_stripped\.so \+ 0x[0-9a-f]+\))");
  const std::regex exported(
      R"(frame #\d+: ddpl_test_call_through_stripped \+ 0x[0-9a-f]+ \(/\S+/libddpl_test_stripped\.so \+ 0x[0-9a-f]+\))");
  EXPECT_EQ(std::count_if(lines.begin(), lines.end(),
                          [&](const std::string& l) { return std::regex_match(l, hidden); }),
            1)
      << ::testing::PrintToString(lines);
  EXPECT_EQ(std::count_if(lines.begin(), lines.end(),
                          [&](const std::string& l) { return std::regex_match(l, exported); }),
            1)
      << ::testing::PrintToString(lines);
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines[0].rfind("frame #0: ddpl_test::captureHere() at ", 0), 0u) << lines[0];
}

TEST(NativeTrace, CutAtTheDeadlineKeepsModuleAndOffsetAndSaysSo) {
  ddpl_test::outerStep();
  dw::NativeTraceOptions options;
  options.timeout = std::chrono::milliseconds(0);
  const auto trace = dw::symbolize(ddpl_test::captured, options);
  EXPECT_NE(trace.note.find("symbolisation stopped after"), std::string::npos) << trace.note;
  EXPECT_NE(trace.note.find("frames from #0 on are as captured"), std::string::npos) << trace.note;
  ASSERT_FALSE(trace.frames.empty());
  for (const auto& f : trace.frames) {
    EXPECT_FALSE(f.resolved);
    EXPECT_TRUE(f.locations.empty());
  }
  const auto lines = linesOf(dw::formatTrace(trace));
  ASSERT_GE(lines.size(), 2u);
  EXPECT_EQ(lines[0], "(" + trace.note + ")");
  // The loader knows the module (as the program was started) but not the static function.
  EXPECT_TRUE(std::regex_match(
      lines[1],
      std::regex(R"(frame #0: <unknown function> \(\S*native_trace_test \+ 0x[0-9a-f]+\))")))
      << lines[1];
  expectNoChildLeft();
}

TEST(NativeTrace, SwitchedOffKeepsWhatTheLoaderKnows) {
  ddpl_test::outerStep();
  dw::NativeTraceOptions options;
  options.symbolize = false;
  const auto trace = dw::symbolize(ddpl_test::captured, options);
  EXPECT_EQ(trace.note, "");
  ASSERT_FALSE(trace.frames.empty());
  EXPECT_FALSE(trace.frames[0].resolved);
  EXPECT_TRUE(endsWith(trace.frames[0].module, "native_trace_test")) << trace.frames[0].module;
}

// c10::Error's backtrace is text; its frames are rewritten in place, everything else is kept,
// and so is a frame that no module maps (it names the module as the loader knew it).
TEST(NativeTrace, RewritesC10FramesAndKeepsEverythingElse) {
  char address[32];
  std::snprintf(address, sizeof(address), "0x%lx",
                static_cast<unsigned long>(reinterpret_cast<uintptr_t>(&ddpl_test::outerStep) + 1));
  const std::vector<std::string> in{
      "Exception raised from f at a.cc:1 (most recent call first):",
      "frame #0: <unknown function> + 0x10 (0x10 in /gone/libx.so)",
      "frame #1: <unknown function> + 0x1234 (" + std::string(address) + " in ./native_trace_test)",
      "frame #2: not a frame line", "trailing words"};
  std::string text;
  for (const auto& l : in) text += l + "\n";
  const auto out = linesOf(dw::symbolizeBacktraceText(text));
  ASSERT_EQ(out.size(), in.size()) << ::testing::PrintToString(out);
  EXPECT_EQ(out[0], in[0]);
  EXPECT_EQ(out[1], in[1]);
  EXPECT_EQ(out[2].rfind("frame #1: ddpl_test::outerStep() at ", 0), 0u) << out[2];
  Dl_info info{};
  ASSERT_NE(::dladdr(reinterpret_cast<void*>(&ddpl_test::outerStep), &info), 0);
  char offset[32];
  std::snprintf(offset, sizeof(offset), "0x%lx",
                static_cast<unsigned long>(std::strtoul(address, nullptr, 16) -
                                           reinterpret_cast<uintptr_t>(info.dli_fbase)));
  EXPECT_TRUE(endsWith(out[2], " (" + ownPath() + " + " + offset + ")")) << out[2];
  EXPECT_EQ(out[3], in[3]);
  EXPECT_EQ(out[4], in[4]);
  expectNoChildLeft();
}

// Every exception keeps the stack of its throw (worker/throw_stack.cc), found again from the
// exception once it has been caught and its frames unwound.
const dw::SymbolizedFrame& throwFrame(const dw::SymbolizedTrace& trace, size_t i) {
  static const dw::SymbolizedFrame kNone;
  return i < trace.frames.size() ? trace.frames[i] : kNone;
}

std::string functionOf(const dw::SymbolizedFrame& f) {
  return f.locations.empty() ? "" : f.locations.back().function;
}

TEST(ThrowStack, CaughtExceptionStillNamesItsThrowSite) {
  std::exception_ptr error;
  try {
    ddpl_test::callThrower(7);
  } catch (const std::exception&) {
    error = std::current_exception();
  }
  ASSERT_TRUE(error);
  const auto frames = dw::throwStackOf(error);
  ASSERT_GE(frames.size(), 3u);
  EXPECT_LE(frames.size(), dw::kThrowStackFrames);
  const auto trace = dw::symbolize(frames);
  EXPECT_EQ(trace.note, "");
  // Innermost first: the throw expression, then its caller; no frame of the recording itself.
  const auto& thrower = throwFrame(trace, 0);
  EXPECT_EQ(functionOf(thrower), "ddpl_test::throwHere(int)") << dw::formatTrace(trace);
  ASSERT_FALSE(thrower.locations.empty());
  EXPECT_TRUE(endsWith(thrower.locations.back().file, kThisFile));
  EXPECT_EQ(thrower.locations.back().line, lineOf("throw")) << dw::formatTrace(trace);
  EXPECT_EQ(functionOf(throwFrame(trace, 1)), "ddpl_test::callThrower(int)");
  ASSERT_FALSE(throwFrame(trace, 1).locations.empty());
  EXPECT_EQ(throwFrame(trace, 1).locations.back().line, lineOf("call thrower"));
  expectNoChildLeft();
}

// Thrown in one thread, reported in another (std::future does this).
TEST(ThrowStack, FoundFromAnotherThread) {
  std::exception_ptr error;
  std::thread([&] {
    try {
      ddpl_test::callThrower(3);
    } catch (...) {
      error = std::current_exception();
    }
  }).join();
  const auto trace = dw::symbolize(dw::throwStackOf(error));
  EXPECT_EQ(functionOf(throwFrame(trace, 0)), "ddpl_test::throwHere(int)")
      << dw::formatTrace(trace);
}

// std::make_exception_ptr makes an exception without throwing it, often at the address an
// earlier exception of the same size freed: it has the stack of where it was made, not that one's.
TEST(ThrowStack, MadeExceptionHasItsOwnStack) {
  for (int i = 0; i < 3; ++i) {
    try {
      ddpl_test::callThrower(1);
    } catch (...) {
    }
    const auto trace = dw::symbolize(dw::throwStackOf(ddpl_test::madeHere()));
    // std::make_exception_ptr itself may have a frame of its own, inner to madeHere's.
    const size_t maker = functionOf(throwFrame(trace, 0)) == "ddpl_test::madeHere()" ? 0 : 1;
    EXPECT_EQ(functionOf(throwFrame(trace, maker)), "ddpl_test::madeHere()")
        << dw::formatTrace(trace);
    if (!throwFrame(trace, maker).locations.empty())
      EXPECT_EQ(throwFrame(trace, maker).locations.back().line, lineOf("make"));
    for (const auto& f : trace.frames) EXPECT_NE(functionOf(f), "ddpl_test::throwHere(int)");
  }
}

TEST(ThrowStack, NoExceptionNoFrames) { EXPECT_TRUE(dw::throwStackOf(nullptr).empty()); }

TEST(ThrowStack, FrameLimitAppliesToLaterThrows) {
  const auto thrown = [] {
    try {
      ddpl_test::callThrower(2);
    } catch (...) {
      return std::current_exception();
    }
    return std::exception_ptr();
  };
  EXPECT_EQ(dw::setThrowStackFrames(1), dw::kThrowStackFrames);
  const auto one = thrown();
  EXPECT_EQ(dw::setThrowStackFrames(0), 1u);
  EXPECT_TRUE(dw::throwStackOf(thrown()).empty());
  EXPECT_EQ(dw::setThrowStackFrames(1000), 0u);  // at most kThrowStackFrames
  EXPECT_GE(dw::throwStackOf(thrown()).size(), 3u);
  EXPECT_EQ(dw::setThrowStackFrames(dw::kThrowStackFrames), dw::kThrowStackFrames);
  ASSERT_EQ(dw::throwStackOf(one).size(), 1u);
  EXPECT_EQ(functionOf(dw::symbolize(dw::throwStackOf(one)).frames[0]),
            "ddpl_test::throwHere(int)");
}

}  // namespace
