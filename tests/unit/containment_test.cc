// launcher/agent/containment.h's /proc readings, on real processes.
#include "launcher/agent/containment.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

using namespace ddpl::launcher;

// A rank whose main process waits while a child computes (a DataLoader worker) is not idle: the
// hang judgement reads the CPU time of the whole tree (issue 33).
TEST(Containment, TreeCpuTimeCountsTheChildrenThatCompute) {
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    setpgid(0, 0);
    execl("/bin/sh", "sh", "-c", "(while :; do :; done) & sleep 30", static_cast<char*>(nullptr));
    _exit(127);
  }
  setpgid(pid, pid);
  double tree = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (tree < 0.3 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    tree = processTreeCpuSeconds(pid);
  }
  double own = processCpuSeconds(pid);
  kill(-pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  EXPECT_GE(tree, 0.3);
  EXPECT_LT(own, 0.1) << "the shell itself only waits";
  EXPECT_EQ(processTreeCpuSeconds(pid), 0) << "gone: nothing to count";
}
