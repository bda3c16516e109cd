// The floor for launch overhead: fork/exec N copies of a program and reap them, nothing else.
// usage: spawn_floor N PROGRAM [ARGS...]
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "common/parse.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: spawn_floor N PROGRAM [ARGS...]\n");
    return 2;
  }
  int n;
  try {
    n = static_cast<int>(ddpl::parseInteger("N", argv[1], 1, 100000));
  } catch (const ddpl::InvalidArgument& e) {
    fprintf(stderr, "spawn_floor: %s\n", e.what());
    return 2;
  }
  std::vector<pid_t> pids;
  for (int i = 0; i < n; ++i) {
    pid_t pid = fork();
    if (pid == 0) {
      execv(argv[2], argv + 2);
      _exit(127);
    }
    pids.push_back(pid);
  }
  int rc = 0;
  for (pid_t p : pids) {
    int st;
    waitpid(p, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) rc = 1;
  }
  return rc;
}
