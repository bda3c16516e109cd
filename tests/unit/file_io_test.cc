// common/file_io.h: the one atomic-file-write helper behind checkpoints, error files, the run
// manifest and port files.
#include "common/file_io.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/errors.h"

namespace fs = std::filesystem;
using ::testing::HasSubstr;

namespace {

class FileIo : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ddpl_file_io_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    ::chmod(dir_.c_str(), 0700);
    fs::remove_all(dir_);
  }
  static std::string read(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
  std::string dir_;
};

}  // namespace

TEST_F(FileIo, WritesAndReplacesWholeFilesLeavingNoTemporary) {
  const std::string path = dir_ + "/state.json";
  ddpl::writeFileAtomically(path, "first\n");
  EXPECT_EQ(read(path), "first\n");
  // Pieces from a producer, with a NUL byte: the helper copies bytes, not C strings.
  const std::string binary("a\0b", 3);
  ddpl::writeFileAtomically(path, [&](const ddpl::FileSink& sink) {
    sink(binary.data(), binary.size());
    sink("tail", 4);
  });
  EXPECT_EQ(read(path), binary + "tail");
  EXPECT_EQ(names(), std::vector<std::string>{"state.json"});
}

// Issue 33: the temporary's name is predictable ("<path>.tmp.<pid>"); in a shared directory
// another user may plant a symlink there. The write must never go through it.
TEST_F(FileIo, APlantedSymlinkAtTheTemporaryNameIsNeverWrittenThrough) {
  const std::string victim = dir_ + "/victim";
  { std::ofstream(victim) << "precious\n"; }
  const std::string path = dir_ + "/manifest.json";
  ASSERT_EQ(::symlink(victim.c_str(), ddpl::atomicWriteTempPath(path).c_str()), 0);
  ddpl::writeFileAtomically(path, "new\n", {.mode = 0600, .durable = false});
  EXPECT_EQ(read(victim), "precious\n");
  EXPECT_EQ(read(path), "new\n");
  struct stat st {};
  ASSERT_EQ(::lstat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(names(), (std::vector<std::string>{"manifest.json", "victim"}));
}

TEST_F(FileIo, ModeAndTheNotDurableVariant) {
  const std::string path = dir_ + "/port";
  const mode_t old_umask = ::umask(022);
  ddpl::AtomicWriteOptions o;
  o.mode = 0600;
  o.durable = false;
  ddpl::writeFileAtomically(path, "29400\n", o);
  ::umask(old_umask);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(read(path), "29400\n");
}

// The message of the ddpl::Error that writing `contents` to `path` throws ("" when none), as an
// unprivileged user: permissions do not stop root, which the tests may run as.
static std::string errorWritingUnprivileged(const std::string& path, const std::string& contents) {
  auto attempt = [&]() -> std::string {
    try {
      ddpl::writeFileAtomically(path, contents);
      return "";
    } catch (const ddpl::Error& e) {
      return e.what();
    }
  };
  if (::geteuid() != 0) return attempt();
  int fds[2];
  if (::pipe(fds) != 0) return "pipe failed";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(3);
    const std::string message = attempt();
    ddpl::writeAll(fds[1], message.data(), message.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string message;
  char buf[512];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof(buf))) > 0) message.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return "child failed: status " + std::to_string(status);
  return message;
}

TEST_F(FileIo, UnwritableDirectoryIsAnErrorNamingPathAndErrnoAndLeavesNothing) {
  const std::string path = dir_ + "/ckpt.pt";
  ddpl::writeFileAtomically(path, "old");
  ASSERT_EQ(::chmod(path.c_str(), 0644), 0);
  ASSERT_EQ(::chmod(dir_.c_str(), 0555), 0);  // readable and searchable, not writable
  const std::string message = errorWritingUnprivileged(path, "new");
  EXPECT_THAT(message, HasSubstr("cannot write " + path + ": create"));
  EXPECT_THAT(message, HasSubstr(".tmp."));
  EXPECT_THAT(message, HasSubstr("(errno " + std::to_string(EACCES) + ")"));
  ::chmod(dir_.c_str(), 0700);
  EXPECT_EQ(read(path), "old");  // the previous file is untouched
  EXPECT_EQ(names(), std::vector<std::string>{"ckpt.pt"});
}

TEST_F(FileIo, FileSizeLimitFailsMidWriteAndRemovesTheTemporary) {
  // A write that fails after the temporary exists and holds part of the data (EFBIG past
  // RLIMIT_FSIZE, which binds root too), the way a full disk would.
  const std::string path = dir_ + "/big";
  ddpl::writeFileAtomically(path, "old");
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto* previous = ::signal(SIGXFSZ, SIG_IGN);
  rlimit small = saved;
  small.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string message;
  try {
    ddpl::writeFileAtomically(path, std::string(64 << 10, 'b'));
  } catch (const ddpl::Error& e) {
    message = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &saved);
  ::signal(SIGXFSZ, previous);
  EXPECT_THAT(message,
              HasSubstr("cannot write " + path + ": write " + ddpl::atomicWriteTempPath(path)));
  EXPECT_THAT(message, HasSubstr("(errno " + std::to_string(EFBIG) + ")"));
  EXPECT_EQ(read(path), "old");
  EXPECT_EQ(names(), std::vector<std::string>{"big"});
}

TEST_F(FileIo, FailedWriteRemovesTheTemporaryAndKeepsTheOldFile) {
  // A write that fails part way (a bad buffer: EFAULT, deterministic where ENOSPC is not).
  const std::string path = dir_ + "/out";
  ddpl::writeFileAtomically(path, "old");
  try {
    ddpl::writeFileAtomically(path, [&](const ddpl::FileSink& sink) {
      sink("partial", 7);
      sink(reinterpret_cast<const void*>(uintptr_t{8}), 16);
    });
    FAIL() << "a failed write was not reported";
  } catch (const ddpl::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("write " + ddpl::atomicWriteTempPath(path)));
    EXPECT_THAT(e.what(), HasSubstr("(errno " + std::to_string(EFAULT) + ")"));
  }
  EXPECT_EQ(read(path), "old");
  EXPECT_EQ(names(), std::vector<std::string>{"out"});
}

TEST_F(FileIo, ProducerExceptionPropagatesUnchangedAndLeavesNothing) {
  const std::string path = dir_ + "/result";
  EXPECT_THROW(ddpl::writeFileAtomically(path,
                                         [](const ddpl::FileSink& sink) {
                                           sink("half", 4);
                                           throw std::out_of_range("producer gave up");
                                         }),
               std::out_of_range);
  EXPECT_TRUE(names().empty());
}

TEST_F(FileIo, MissingDirectoryNamesThePath) {
  const std::string path = dir_ + "/no/such/dir/file";
  try {
    ddpl::writeFileAtomically(path, "x");
    FAIL();
  } catch (const ddpl::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("cannot write " + path + ": create"));
    EXPECT_THAT(e.what(), HasSubstr("(errno " + std::to_string(ENOENT) + ")"));
  }
}

// Issue 33: a directory at a name known in advance (the MPI ranks' shared error directory).
TEST_F(FileIo, PrivateDirectoryIsMadeOrAcceptedOnlyWhenItIsReallyOurs) {
  const std::string fresh = dir_ + "/fresh";
  ddpl::ensurePrivateDirectory(fresh);
  struct stat st {};
  ASSERT_EQ(::lstat(fresh.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ddpl::ensurePrivateDirectory(fresh);  // the second rank: accepted
  const std::string target = dir_ + "/target";
  fs::create_directory(target);
  ::chmod(target.c_str(), 0700);
  const std::string planted = dir_ + "/planted";
  ASSERT_EQ(::symlink(target.c_str(), planted.c_str()), 0);
  try {
    ddpl::ensurePrivateDirectory(planted);
    ADD_FAILURE() << "a symlink was accepted";
  } catch (const ddpl::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("not a directory"));
  }
  const std::string open_dir = dir_ + "/open";
  fs::create_directory(open_dir);
  ::chmod(open_dir.c_str(), 0777);
  try {
    ddpl::ensurePrivateDirectory(open_dir);
    ADD_FAILURE() << "a directory open to others was accepted";
  } catch (const ddpl::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("mode 777"));
  }
}

TEST(WriteAll, RetriesShortWritesAndReportsErrno) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  // More than a pipe holds, read by another thread: write(2) returns short counts.
  std::string big(1 << 20, 'z');
  std::string got;
  std::thread reader([&] {
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fds[0], buf, sizeof(buf))) > 0) got.append(buf, static_cast<size_t>(n));
  });
  EXPECT_EQ(ddpl::writeAll(fds[1], big.data(), big.size()), 0);
  ::close(fds[1]);
  reader.join();
  EXPECT_EQ(got, big);
  ::close(fds[0]);
  EXPECT_EQ(ddpl::writeAll(fds[1], "x", 1), EBADF);  // closed: the errno comes back
  const int full = ::open("/dev/full", O_WRONLY | O_CLOEXEC);
  if (full >= 0) {
    EXPECT_EQ(ddpl::writeAll(full, "x", 1), ENOSPC);
    ::close(full);
  }
}
