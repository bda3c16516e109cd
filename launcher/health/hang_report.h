#pragma once
// What a hang report says about the ranks of a node (issue 48): their stacks grouped as a reader
// would group them (the same frames, line numbers inside torch and other libraries ignored, the
// program's own frames with file:line), the collective each one waits in, and the outliers:
//   ranks 0, 1, 3 wait in all_reduce #21 of default_pg (sizes [[4]]) at
//     distributed_c10d.py:2942 <- train.py:41 `dist.all_reduce(t)`
//   rank 2 in main (train.py:57) `time.sleep(60)`, last collective #20 (all_reduce)
//   likely culprit: rank(s) 2 (never entered all_reduce #21 of default_pg; last collective #20)
// The flight recorder (flight_recorder.h) numbers the collectives and tells a rank that never
// entered collective N, or entered another operation as its N (mismatched calls), even when
// every rank is inside some collective; without it the stacks decide: a rank outside any
// collective while others wait in one, or in a different one than most.
//
// Pure: the stacks service gathers the evidence; unit-tested without processes.
#include <optional>
#include <string>
#include <vector>

#include "launcher/health/flight_recorder.h"
#include "launcher/health/stacks.h"

namespace ddpl::launcher {

struct RankEvidence {
  int global_rank = 0;
  int local_rank = 0;
  StackSummary stack;              // frames empty: no stack could be taken
  std::optional<FlightRecord> fr;  // not asked: nullopt
};

// One frame of a stack as the report reads it.
struct ReadFrame {
  std::string func;     // py-spy: the function; native: the symbol
  std::string file;     // py-spy's file as it printed it ("torch/distributed/distributed_c10d.py")
  int line = -1;        // -1: none
  bool native = false;  // eu-stack or gdb
  bool user = false;    // the program's own code (StackFrame::user)
  std::string source;   // the line's text, for the program's own frames, when it was read
  // How it counts for grouping: library frames without their line numbers, native ones
  // without addresses.
  std::string key() const;
  // "main (train.py:57)"; library frames keep their line here.
  std::string shown() const;
};
ReadFrame readFrame(const StackFrame& f);

// The collective a stack is inside: the program's call into torch.distributed's API (the
// outermost public function of distributed_c10d.py, e.g. all_reduce; all_gather_object rather
// than the all_gather it calls), or a native frame of c10d, Gloo or NCCL (op empty: unknown).
struct StackCollective {
  std::string op;      // "all_reduce"; "" when only native frames say so
  std::string site;    // "distributed_c10d.py:2942"
  std::string caller;  // the nearest frame of the program's own outside it: "train.py:41"
  std::string caller_source;
};
std::optional<StackCollective> collectiveOf(const std::vector<StackFrame>& frames);

struct HangReport {
  // One line per group of ranks that stand in the same place: "ranks 0, 1, 3 wait in ...".
  std::vector<std::string> groups;
  // The likely culprits (global ranks, ascending) and why, for "likely culprit: rank(s) 2
  // (<why>)"; empty when the evidence names none (every rank waits in the same collective, or
  // none does, or no stack was taken).
  std::vector<int> culprits;
  std::string why;
  // Where no culprit is named but the flight recorder saw every rank enter the same collective
  // (the cause is then elsewhere: a peer on another node, the network).
  std::string note;
};

HangReport analyzeHang(const std::vector<RankEvidence>& ranks);

}  // namespace ddpl::launcher
