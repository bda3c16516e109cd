// The C++ frames of ddp_resnet's error file (issue 33), as `launch` collects it: an exception
// that ends the program names the function and the source line of its throw, whichever way it
// leaves main (a bad input caught before the job starts, or one escaping the training through
// recordErrors), and no frame of the program itself goes unnamed. The program is built with
// debug information (RelWithDebInfo, and PIE): every frame in it can be named.
#include <gtest/gtest.h>
#include <limits.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "tests/common/subprocess.h"
#include "tests/integration/example_procs.h"

namespace et = ddpl::example::testing;
namespace dt = ddpl::testing;
namespace fs = std::filesystem;

namespace {

std::string realPath(const std::string& path) {
  char resolved[PATH_MAX];
  return ::realpath(path.c_str(), resolved) ? resolved : path;
}

// The line of `source` (relative to the repository) that contains `text`, which must be unique.
int lineOf(const std::string& source, const std::string& text) {
  std::ifstream in(std::string(DDPL_SOURCE_DIR) + "/" + source);
  int n = 0, found = -1;
  for (std::string line; std::getline(in, line);) {
    ++n;
    if (line.find(text) == std::string::npos) continue;
    EXPECT_EQ(found, -1) << "'" << text << "' twice in " << source;
    found = n;
  }
  EXPECT_GT(found, 0) << "no '" << text << "' in " << source;
  return found;
}

using ::ddpl::testing::frameLines;

// "frame #N: <function> at <file>:<line> (<module> + 0x<offset>)", named with its source.
struct Frame {
  std::string function, file, module;
  int line = 0;
};

bool parseNamedFrame(const std::string& text, Frame& f) {
  static const std::regex re(R"(frame #\d+: (.+) at (\S+):(\d+) \((\S+) \+ 0x[0-9a-f]+\))");
  std::smatch m;
  if (!std::regex_match(text, m, re)) return false;
  f = {m[1].str(), m[2].str(), m[4].str(), std::stoi(m[3].str())};
  return true;
}

bool endsWith(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

class ExampleErrorFile : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = dt::makeTempDir("ddpl-example-error-file"); }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }

  // One rank under launch; returns launch's result and the worker's error file.
  dt::RunResult launch(const std::vector<std::string>& trainerArgs, nlohmann::json& error) {
    std::vector<std::string> argv{et::binary("launch"), "--standalone", "--nproc-per-node=1",
                                  "--log-dir",          dir_ + "/logs", et::trainer()};
    argv.insert(argv.end(), trainerArgs.begin(), trainerArgs.end());
    dt::RunOptions o;
    o.env = {{"OMP_NUM_THREADS", "1"}, {"DDPL_BACKEND", "gloo"}};
    o.timeout = std::chrono::seconds(120);
    auto r = dt::run(argv, o);
    // <log dir>/<run>/attempt_0/0/error.json
    std::error_code ec;
    for (const auto& e : fs::recursive_directory_iterator(dir_ + "/logs", ec)) {
      if (e.path().filename() == "error.json" && e.path().parent_path().filename() == "0" &&
          e.path().parent_path().parent_path().filename() == "attempt_0")
        error = nlohmann::json::parse(et::slurp(e.path().string()));
    }
    return r;
  }

  // Checks what every trace of ddp_resnet must show, and returns its frames named with a source
  // line that lie in ddp_resnet, innermost first.
  std::vector<Frame> programFrames(const std::string& trace) {
    EXPECT_EQ(trace.rfind("Thrown from (most recent call first):\n", 0), 0u) << trace;
    EXPECT_EQ(trace.find("(symbolisation stopped"), std::string::npos) << trace;
    EXPECT_EQ(trace.find("(not symbolised"), std::string::npos) << trace;
    const std::string program = realPath(et::trainer());
    std::vector<Frame> frames;
    for (const auto& line : frameLines(trace)) {
      const bool inProgram = line.find("(" + program + " + 0x") != std::string::npos;
      if (!inProgram) continue;
      // The program's own frames all have debug information (libc's _start excepted: it is
      // linked in from crt1.o without any, and is named from the symbol table).
      EXPECT_EQ(line.find(": <unknown function> ("), std::string::npos) << line << "\n" << trace;
      Frame f;
      if (parseNamedFrame(line, f))
        frames.push_back(f);
      else
        EXPECT_NE(line.find(": _start + 0x"), std::string::npos) << line << "\n" << trace;
    }
    return frames;
  }

  std::string dir_;
};

TEST_F(ExampleErrorFile, BadInputNamesTheCheckThatThrew) {
  nlohmann::json error;
  const auto r = launch({"--data", dir_ + "/nonexistent-x"}, error);
  EXPECT_FALSE(r.timed_out);
  EXPECT_NE(r.exit_code, 0) << r.all();
  ASSERT_TRUE(error.is_object()) << "no error file under " << dir_ << "/logs\n" << r.all();
  EXPECT_EQ(
      error["message"]["message"].get<std::string>(),
      "ddpl::example::DataError: --data " + dir_ + "/nonexistent-x: No such file or directory");
  const std::string trace = error["message"]["extraInfo"]["py_callstack"].get<std::string>();
  const auto frames = frameLines(trace);
  ASSERT_FALSE(frames.empty()) << trace;
  // The first frame is the throw, in the function that threw, at its line.
  Frame thrower;
  ASSERT_TRUE(parseNamedFrame(frames[0], thrower)) << trace;
  EXPECT_EQ(thrower.function.rfind("ddpl::example::loadCifar10(", 0), 0u) << trace;
  EXPECT_TRUE(endsWith(thrower.file, "/examples/ddp_resnet/cifar10.cc")) << trace;
  EXPECT_EQ(thrower.line,
            lineOf("examples/ddp_resnet/cifar10.cc",
                   "throw DataError(\"--data \" + dir + \": \" + std::strerror(errno))"))
      << trace;
  EXPECT_EQ(thrower.module, realPath(et::trainer())) << trace;
  const auto named = programFrames(trace);
  ASSERT_GE(named.size(), 2u) << trace;
  EXPECT_EQ(named[1].function, "main") << trace;
  EXPECT_TRUE(endsWith(named[1].file, "/examples/ddp_resnet/train.cc")) << trace;
  // launch's failure report shows the same frame.
  EXPECT_NE(r.all().find(frames[0]), std::string::npos) << r.all();
}

// A failure inside the training leaves main through recordErrors, which has caught it: its
// frames are unwound by then, the ones recorded at the throw are reported. Here LibTorch's copy
// of std::filesystem throws, called by the worker library, called by ddp_resnet.
TEST_F(ExampleErrorFile, FailureInTrainingNamesItsThrowSite) {
  std::ofstream(dir_ + "/a-file") << "not a directory\n";
  nlohmann::json error;
  const auto r = launch({"--width", "4", "--train-size", "64", "--test-size", "16", "--batch-size",
                         "16", "--epochs", "1", "--checkpoint-dir", dir_ + "/a-file/ckpt"},
                        error);
  EXPECT_FALSE(r.timed_out);
  EXPECT_NE(r.exit_code, 0) << r.all();
  ASSERT_TRUE(error.is_object()) << "no error file under " << dir_ << "/logs\n" << r.all();
  EXPECT_NE(error["message"]["message"].get<std::string>().find("filesystem_error"),
            std::string::npos)
      << error.dump();
  const std::string trace = error["message"]["extraInfo"]["py_callstack"].get<std::string>();
  const auto named = programFrames(trace);
  ASSERT_FALSE(named.empty()) << trace;
  // The program's innermost frame is the call that threw, not the report's own.
  EXPECT_EQ(named[0].function,
            "ddpl::worker::CheckpointManager::resume(ddpl::worker::CheckpointRefs const&)")
      << trace;
  EXPECT_TRUE(endsWith(named[0].file, "/worker/checkpoint_manager.cc")) << trace;
  EXPECT_EQ(named[0].line,
            lineOf("worker/checkpoint_manager.cc", "fs::create_directories(dir_.dir())"))
      << trace;
  EXPECT_EQ(trace.find("describeImpl"), std::string::npos) << trace;
}

}  // namespace
