// The C++ side of checkpoint format 1 (common/checkpoint_files.h) as a command line, so that the
// Python module's tests can write with it what they read, and read with it what they write
// (tests/unit/python_checkpoint_golden_test.py). Each command prints one JSON value on stdout;
// a refusal is exit 2 with the message on stderr, a stale round's fence exit 3.
//
//   commit ROOT RANK WORLD STEP SRC [durable=PATH persist=0|1 replicated=0|1 keep=N
//          memory_keep=K run=ID epoch=E round=R]   SRC's files as step STEP of RANK in ROOT
//   persist STEP_DIR STEP RANK                     launch's copy to the durable place, then
//                                                  durable retention for the rank
//   committed RANK_DIR RANK                        the valid committed steps, newest first
//   durable DIR RANK                               the durable steps RANK can read
//   retire DIR RANK KEEP                           durable retention alone
//   decode FILE                                    a record read and written back
//   fence DIR RUN EPOCH ROUND                      a commit's fence taken and released
#include <dirent.h>
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/checkpoint_files.h"
#include "common/errors.h"

namespace ck = ddpl::ckpt;
using nlohmann::json;

namespace {

std::string readAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ddpl::Error("cannot read " + path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// SRC's regular files, recursively, into DST (made as the writer makes directories).
void copyInto(const std::string& src, const std::string& dst) {
  DIR* d = opendir(src.c_str());
  if (!d) throw ddpl::Error("cannot list " + src);
  std::vector<std::string> names;
  while (dirent* e = readdir(d))
    if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") names.push_back(e->d_name);
  closedir(d);
  for (const auto& name : names) {
    struct stat st {};
    std::string from = src + "/" + name, to = dst + "/" + name;
    if (lstat(from.c_str(), &st) != 0) continue;
    if (S_ISDIR(st.st_mode)) {
      if (mkdir(to.c_str(), 0700) != 0) throw ddpl::Error("cannot create " + to);
      copyInto(from, to);
    } else {
      std::ofstream(to, std::ios::binary) << readAll(from);
    }
  }
}

std::map<std::string, std::string> options(int argc, char** argv, int first) {
  std::map<std::string, std::string> out;
  for (int i = first; i < argc; ++i) {
    std::string a = argv[i];
    auto eq = a.find('=');
    if (eq == std::string::npos) throw ddpl::InvalidArgument("expected key=value: " + a);
    out[a.substr(0, eq)] = a.substr(eq + 1);
  }
  return out;
}

json stepsJson(const std::vector<ck::StoredStep>& steps) {
  json out = json::array();
  for (const auto& s : steps)
    out.push_back(
        {{"step", s.step}, {"dir", s.dir}, {"record", json::parse(ck::encodeRecord(s.record))}});
  return out;
}

int64_t number(const char* text) { return std::stoll(text); }

json run(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "commit" && argc >= 7) {
    auto o = options(argc, argv, 7);
    auto get = [&](const std::string& k, const std::string& dflt) {
      return o.count(k) ? o[k] : dflt;
    };
    const int64_t rank = number(argv[3]), step = number(argv[5]);
    std::string rank_dir = ck::makeRankDir(argv[2], rank);
    std::string partial = ck::beginStep(rank_dir, step);
    copyInto(argv[6], partial);
    ck::CommitRecord r;
    r.step = step;
    r.rank = rank;
    r.world_size = number(argv[4]);
    r.durable_path = get("durable", "");
    r.persist = get("persist", "1") == "1";
    r.replicated = get("replicated", "0") == "1";
    r.keep = std::stoll(get("keep", "2"));
    r.writer = {get("run", ""), std::stoll(get("epoch", "0")), std::stoll(get("round", "0"))};
    std::string dir = ck::commitStep(rank_dir, partial, r);
    ck::trimCommitted(rank_dir, std::stoll(get("memory_keep", "1")), step);
    return {{"dir", dir}};
  }
  if (cmd == "persist" && argc == 5) {
    std::string why;
    auto r = ck::readCommitted(argv[2], number(argv[3]), number(argv[4]), &why);
    if (!r) throw ddpl::InvalidArgument("not a committed step: " + why);
    uint64_t bytes = ck::persistStep(argv[2], *r, /*move=*/false);
    size_t retired = ck::retireDurable(ck::durableRoot(*r), r->rank, r->keep);
    return {{"bytes", bytes}, {"retired", retired}};
  }
  if (cmd == "committed" && argc == 4)
    return stepsJson(ck::listCommitted(argv[2], number(argv[3])));
  if (cmd == "durable" && argc == 4) return stepsJson(ck::listDurable(argv[2], number(argv[3])));
  if (cmd == "retire" && argc == 5)
    return {{"retired", ck::retireDurable(argv[2], number(argv[3]), number(argv[4]))}};
  if (cmd == "decode" && argc == 3)
    return json::parse(ck::encodeRecord(ck::decodeRecord(readAll(argv[2]))));
  if (cmd == "fence" && argc == 6) {
    ck::FenceGuard fence(argv[2], {argv[3], number(argv[4]), number(argv[5])}, "checkpoint_tool");
    return {{"fenced", argv[2]}};
  }
  throw ddpl::InvalidArgument("usage: see tests/integration/programs/checkpoint_tool.cc");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::cout << run(argc, argv).dump() << "\n";
    return 0;
  } catch (const ck::StaleRoundError& e) {
    std::cerr << e.what() << "\n";
    return 3;
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 2;
  }
}
