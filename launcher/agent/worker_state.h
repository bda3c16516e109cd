#pragma once
// What the agent's parts know of one worker of the current attempt: a copy the loop hands them,
// never a reference into the loop's own records.
#include <sys/types.h>

namespace ddpl::launcher {

struct WorkerState {
  int local_rank = 0;
  int global_rank = 0;
  pid_t pid = -1;
  bool alive = false;
};

}  // namespace ddpl::launcher
