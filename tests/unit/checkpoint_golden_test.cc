// Checkpoint format 1 byte for byte (docs/checkpoints.md): the C++ side (common/checkpoint_format.h
// and common/checkpoint_files.h) against the golden vectors in tests/golden/checkpoint, which the
// Python module (tests/unit/python_checkpoint_golden_test.py) is held to as well. It reads every
// golden step and checks every field, offers from the golden trees what the spec says, refuses
// the broken records with their reasons, gives the rules' answers, and writes the spec's commits
// into the golden trees' bytes. DDPL_UPDATE_GOLDEN=1 writes the trees instead of comparing (a
// change of the format: the diff is then the change, for review).
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "common/checkpoint_files.h"
#include "common/defaults.h"
#include "common/errors.h"
#include "common/torchrun_env.h"
#include "launcher/checkpoint/replica.h"
#include "tests/common/subprocess.h"

namespace fs = std::filesystem;
namespace ck = ddpl::ckpt;
using nlohmann::json;

namespace {

const std::string kGolden = std::string(DDPL_SOURCE_DIR) + "/tests/golden";
const std::string kCases = kGolden + "/checkpoint";

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

json load(const std::string& path) { return json::parse(slurp(path)); }

void spill(const std::string& path, const std::string& bytes) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << bytes;
}

// A file's bytes from the spec: text, or {"hex": "..."}.
std::string contentOf(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  std::string hex = v.at("hex").get<std::string>(), out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

std::string modeOf(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "missing";
  char text[8];
  std::snprintf(text, sizeof text, "%04o", static_cast<unsigned>(st.st_mode & 07777));
  return text;
}

bool isRecordName(const std::string& name) {
  return name == ck::kRecordName || ck::parseMarkerName(name).has_value();
}

// What varies between runs, pinned (cases.json): the record's time and the run's own directory
// in durable_path. Everything else is compared as written.
std::string pinned(const std::string& bytes, const std::string& run_root, const json& spec) {
  std::string out = std::regex_replace(bytes, std::regex(R"re("time":[-+0-9.eE]+)re"),
                                       "\"time\":" + spec.at("time").dump());
  const std::string from = "\"durable_path\":\"" + run_root,
                    to = "\"durable_path\":\"" + spec.at("root").get<std::string>();
  for (size_t at = out.find(from); at != std::string::npos; at = out.find(from, at + to.size()))
    out.replace(at, from.size(), to);
  return out;
}

// Every file (bytes, records pinned) and every directory below `dir`, by relative path.
std::map<std::string, std::string> tree(const std::string& dir, const std::string& run_root,
                                        const json& spec) {
  std::map<std::string, std::string> out;
  if (!fs::exists(dir)) return out;
  for (auto it = fs::recursive_directory_iterator(dir); it != fs::recursive_directory_iterator();
       ++it) {
    std::string rel = fs::relative(it->path(), dir).string();
    if (it->is_directory()) {
      out[rel + "/"] = "";
      continue;
    }
    std::string bytes = slurp(it->path().string());
    out[rel] = isRecordName(it->path().filename().string()) ? pinned(bytes, run_root, spec) : bytes;
  }
  return out;
}

// The record the spec's commit must leave (cases.json), every field.
ck::CommitRecord expectedRecord(const json& c, const json& spec, const std::string& root) {
  ck::CommitRecord r;
  r.step = c.at("step");
  r.rank = c.at("rank");
  r.world_size = c.at("world_size");
  for (const auto& [path, content] : c.at("files").items()) {
    r.files.push_back({path, contentOf(content).size()});
    r.bytes += r.files.back().size;
  }
  std::sort(r.files.begin(), r.files.end(),
            [](const ck::FileEntry& a, const ck::FileEntry& b) { return a.path < b.path; });
  r.durable_path = root + "/durable";
  if (!c.at("flat").get<bool>()) r.durable_path += "/" + ck::stepDirName(r.step);
  r.persist = c.at("persist");
  r.replicated = c.at("replicated");
  r.keep = c.at("keep");
  r.time = spec.at("time");
  if (!c.at("writer").is_null())
    r.writer = {c["writer"][0].get<std::string>(), c["writer"][1].get<int64_t>(),
                c["writer"][2].get<int64_t>()};
  return r;
}

void expectSameRecord(const ck::CommitRecord& got, const ck::CommitRecord& want,
                      const std::string& where) {
  SCOPED_TRACE(where);
  EXPECT_EQ(got.version, 1);
  EXPECT_EQ(got.step, want.step);
  EXPECT_EQ(got.rank, want.rank);
  EXPECT_EQ(got.world_size, want.world_size);
  ASSERT_EQ(got.files.size(), want.files.size());
  for (size_t i = 0; i < got.files.size(); ++i) {
    EXPECT_EQ(got.files[i].path, want.files[i].path);
    EXPECT_EQ(got.files[i].size, want.files[i].size);
  }
  EXPECT_EQ(got.bytes, want.bytes);
  EXPECT_EQ(got.durable_path, want.durable_path);
  EXPECT_EQ(got.persist, want.persist);
  EXPECT_EQ(got.replicated, want.replicated);
  EXPECT_EQ(got.keep, want.keep);
  EXPECT_EQ(got.time, want.time);
  EXPECT_EQ(got.writer.run_id, want.writer.run_id);
  EXPECT_EQ(got.writer.epoch, want.writer.epoch);
  EXPECT_EQ(got.writer.round, want.writer.round);
}

std::vector<int64_t> steps(const std::vector<ck::StoredStep>& stored) {
  std::vector<int64_t> out;
  for (const auto& s : stored) out.push_back(s.step);
  return out;
}

// The spec's commits of one case, as launch's tier and its persister make them: each commit in
// memory (then the memory keep), and each step launch persists (durable; not a replicated step's
// copy of another rank than 0) copied to its durable place, then durable retention.
void writeCase(const json& c, const std::string& root) {
  const bool durable = c.value("durable", true);
  fs::create_directories(root);
  for (const auto& commit : c.at("commits")) {
    ck::CommitRecord r = expectedRecord(commit, json{{"time", 0}}, root);
    std::string rank_dir = ck::makeRankDir(root + "/memory", r.rank);
    std::string partial = ck::beginStep(rank_dir, r.step);
    for (const auto& [path, content] : commit.at("files").items())
      spill(partial + "/" + path, contentOf(content));
    std::string dir = ck::commitStep(rank_dir, partial, r);
    ck::trimCommitted(rank_dir, c.at("memory_keep"), r.step);
    if (durable && r.persist && (!r.replicated || r.rank == 0)) {
      auto committed = ck::readCommitted(dir, r.step, r.rank);
      ASSERT_TRUE(committed) << dir;
      ck::persistStep(dir, *committed, /*move=*/false);
      ck::retireDurable(ck::durableRoot(*committed), r.rank, committed->keep);
    }
  }
}

class Golden : public ::testing::Test {
 protected:
  void SetUp() override {
    spec_ = load(kCases + "/cases.json");
    tmp_ = ddpl::testing::makeTempDir("ddpl-golden");
  }
  void TearDown() override { fs::remove_all(tmp_); }
  json spec_;
  std::string tmp_;
};

TEST(GoldenNames, EnvironmentVariablesAreTheSpecsOnTheCxxSide) {
  namespace e = ddpl::envvar;
  namespace t = ddpl::torchrun_env;
  const std::map<std::string, const char*> cxx = {
      {"envvar::kCheckpointMemory", e::kCheckpointMemory},
      {"envvar::kCheckpointBudget", e::kCheckpointBudget},
      {"envvar::kCheckpointKeep", e::kCheckpointKeep},
      {"envvar::kCheckpointDir", e::kCheckpointDir},
      {"envvar::kRound", e::kRound},
      {"envvar::kRoundEpoch", e::kRoundEpoch},
      {"envvar::kHeartbeatFd", e::kHeartbeatFd},
      {"torchrun_env::kRunId", t::kRunId},
      {"torchrun_env::kRank", t::kRank},
      {"torchrun_env::kWorldSize", t::kWorldSize},
      {"torchrun_env::kLocalRank", t::kLocalRank},
      {"torchrun_env::kLocalWorldSize", t::kLocalWorldSize},
      {"torchrun_env::kMasterAddr", t::kMasterAddr},
      {"torchrun_env::kMasterPort", t::kMasterPort},
  };
  const json vars = load(kGolden + "/environment.json").at("variables");
  EXPECT_EQ(vars.size(), cxx.size()) << "environment.json and this table list other variables";
  for (const auto& [name, sides] : vars.items()) {
    auto it = cxx.find(sides.at("cxx").get<std::string>());
    ASSERT_NE(it, cxx.end()) << name << ": " << sides["cxx"] << " is not in this test's table";
    EXPECT_EQ(name, it->second) << sides["cxx"];
  }
  // The memory tier's own names for the same variables.
  EXPECT_STREQ(ck::kMemoryEnv, e::kCheckpointMemory);
  EXPECT_STREQ(ck::kBudgetEnv, e::kCheckpointBudget);
  EXPECT_STREQ(ck::kKeepEnv, e::kCheckpointKeep);
  EXPECT_STREQ(ck::kDirEnv, e::kCheckpointDir);
}

TEST(GoldenNames, FileNamesLimitsAndNameParsingAreTheSpecs) {
  const json n = load(kCases + "/names.json");
  EXPECT_EQ(n.at("version"), ck::kFormatVersion);
  EXPECT_EQ(n["files"]["record"], ck::kRecordName);
  EXPECT_EQ(n["files"]["fence"], ck::kFenceName);
  EXPECT_EQ(n["files"]["origin"], ck::kOriginName);
  EXPECT_STREQ(ddpl::launcher::kOriginFile, ck::kOriginName);  // launch writes it
  EXPECT_EQ(n["limits"]["max_files"], ck::kMaxFiles);
  EXPECT_EQ(n["limits"]["max_record_bytes"], ck::kMaxRecordBytes);
  EXPECT_EQ(n["limits"]["max_fence_bytes"], ck::kMaxFenceBytes);
  for (const auto& m : n["make"]["rank_dir"]) EXPECT_EQ(ck::rankDirName(m[0]), m[1]);
  for (const auto& m : n["make"]["step_dir"]) EXPECT_EQ(ck::stepDirName(m[0]), m[1]);
  for (const auto& m : n["make"]["partial_dir"])
    EXPECT_EQ(ck::partialDirName(m[0][0], m[0][1]), m[1]);
  for (const auto& m : n["make"]["marker"]) EXPECT_EQ(ck::markerName(m[0][0], m[0][1]), m[1]);
  auto orNull = [](const auto& v) { return v ? json(*v) : json(nullptr); };
  for (const auto& [name, want] : n["parse"]["step_dir"].items())
    EXPECT_EQ(orNull(ck::parseStepDirName(name)), want) << name;
  for (const auto& [name, want] : n["parse"]["rank_dir"].items())
    EXPECT_EQ(orNull(ck::parseRankDirName(name)), want) << name;
  for (const auto& [name, want] : n["parse"]["partial_dir"].items()) {
    auto p = ck::parsePartialDirName(name);
    EXPECT_EQ(p ? json::array({p->step, p->pid}) : json(nullptr), want) << name;
  }
  for (const auto& [name, want] : n["parse"]["marker"].items()) {
    auto m = ck::parseMarkerName(name);
    EXPECT_EQ(m ? json::array({m->step, m->rank}) : json(nullptr), want) << name;
  }
  for (const auto& [path, want] : n["safe_relative_path"].items())
    EXPECT_EQ(ck::safeRelativePath(path), want.get<bool>()) << path;
}

TEST(GoldenRules, AgreementRetirementAllowanceAndTheFence) {
  const json rules = load(kCases + "/rules.json");
  for (const auto& v : rules["agreement"]) {
    auto got = ck::agreeOnStep(v["offers"].get<std::vector<std::vector<int64_t>>>());
    EXPECT_EQ(got ? json(*got) : json(nullptr), v["agreed"]) << v.dump();
  }
  for (const auto& v : rules["retirement"])
    EXPECT_EQ(json(ck::stepsToRetire(v["persisted"], v["keep"])), v["retired"]) << v.dump();
  for (const auto& v : rules["allowance"])
    EXPECT_EQ(ck::writeAllowance(v["budget"], v["committed"]), v["allowance"]) << v.dump();
  auto token = [](const json& t) {
    return ck::FenceToken{t[0].get<std::string>(), t[1].get<int64_t>(), t[2].get<int64_t>()};
  };
  for (const auto& v : rules["fence"]["encode"])
    EXPECT_EQ(ck::encodeFence(token(v["token"])), v["text"].get<std::string>());
  for (const auto& v : rules["fence"]["decode"]) {
    auto t = ck::decodeFence(v["text"]);
    json got = t ? json::array({t->run_id, t->epoch, t->round}) : json(nullptr);
    EXPECT_EQ(got, v["token"]) << v.dump();
  }
  for (const auto& v : rules["fence"]["refuses"])
    EXPECT_EQ(ck::fenceRefuses(token(v["newest"]), token(v["mine"])), v["refused"].get<bool>())
        << v.dump();
}

// Every record in the golden trees (in memory and the markers) reads back as the commit that
// made it, field by field; and there is no record the spec does not account for.
TEST_F(Golden, EveryGoldenRecordReadsAsItsCommitField) {
  size_t checked = 0;
  for (const auto& [name, c] : spec_["cases"].items()) {
    std::map<std::pair<int64_t, int64_t>, json> commits;
    for (const auto& commit : c["commits"]) commits[{commit["step"], commit["rank"]}] = commit;
    for (auto& e : fs::recursive_directory_iterator(kCases + "/" + name)) {
      const std::string file = e.path().filename().string();
      if (!isRecordName(file)) continue;
      const ck::CommitRecord got = ck::decodeRecord(slurp(e.path().string()));
      auto it = commits.find({got.step, got.rank});
      ASSERT_NE(it, commits.end()) << e.path() << ": no commit of this step and rank in the spec";
      expectSameRecord(got, expectedRecord(it->second, spec_, spec_["root"]), e.path().string());
      ++checked;
    }
  }
  EXPECT_EQ(checked, 11u);  // every record of the trees that cases.json describes
}

// What the readers offer from the golden trees, per rank (cases.json "reads", "hostile").
TEST_F(Golden, ReadersOfferWhatTheSpecSays) {
  auto check = [&](const std::string& dir, const json& reads) {
    const json memory = reads.value("memory", json::object());
    const json durable = reads.value("durable", json::object());
    for (const auto& [rank, want] : memory.items()) {
      std::vector<int64_t> got;
      for (const auto& s : ck::listCommitted(dir + "/memory/rank-" + rank, std::stoll(rank)))
        if (s.record.world_size == reads["world_size"]) got.push_back(s.step);
      EXPECT_EQ(json(got), want) << dir << " memory, rank " << rank;
    }
    for (const auto& [rank, want] : durable.items())
      EXPECT_EQ(json(steps(ck::listDurable(dir + "/durable", std::stoll(rank)))), want)
          << dir << " durable, rank " << rank;
  };
  for (const auto& [name, c] : spec_["cases"].items()) check(kCases + "/" + name, c["reads"]);
  check(kCases + "/hostile", spec_["hostile"]);
}

// The spec's commits, made by this side into a directory of its own, leave the golden trees
// byte for byte (the record's time and the run's directory pinned).
TEST_F(Golden, WritingTheCasesGivesTheGoldenBytes) {
  const bool update = std::getenv("DDPL_UPDATE_GOLDEN") != nullptr;
  for (const auto& [name, c] : spec_["cases"].items()) {
    SCOPED_TRACE(name);
    const std::string root = tmp_ + "/" + name;
    writeCase(c, root);
    for (const std::string part : {"memory", "durable"}) {
      auto got = tree(root + "/" + part, root, spec_);
      const std::string golden = kCases + "/" + name + "/" + part;
      if (update) {
        fs::remove_all(golden);
        for (const auto& [rel, bytes] : got)
          if (rel.back() != '/') spill(golden + "/" + rel, bytes);
        continue;
      }
      auto want = tree(golden, spec_["root"], spec_);
      std::set<std::string> got_names, want_names;
      for (const auto& [rel, _] : got) got_names.insert(rel);
      for (const auto& [rel, _] : want) want_names.insert(rel);
      EXPECT_EQ(got_names, want_names) << part;
      for (const auto& [rel, bytes] : got)
        if (want.count(rel)) EXPECT_EQ(bytes, want[rel]) << part << "/" << rel;
      // The durable directories the persister made are private, as the Python module's.
      if (part != "durable" || !fs::exists(root + "/durable")) continue;
      for (const auto& [rel, _] : got)
        if (rel.back() == '/') EXPECT_EQ(modeOf(root + "/durable/" + rel), "0700") << rel;
      EXPECT_EQ(modeOf(root + "/durable"), "0700");
    }
  }
  if (update) GTEST_SKIP() << "DDPL_UPDATE_GOLDEN: wrote the golden trees, compared nothing";
}

// Each broken record is refused, naming what is wrong (records/invalid.json); the reasons are
// the same words on both sides.
TEST(GoldenRecords, BrokenRecordsAreRefusedWithTheirReason) {
  const std::string dir = kCases + "/records";
  const json expected = load(dir + "/invalid.json");
  size_t files = 0;
  for (auto& e : fs::directory_iterator(dir + "/invalid")) {
    ++files;
    const std::string name = e.path().filename().string();
    ASSERT_TRUE(expected.contains(name)) << name << " has no expected reason in invalid.json";
    try {
      ck::decodeRecord(slurp(e.path().string()));
      ADD_FAILURE() << name << " was accepted";
    } catch (const ddpl::InvalidArgument& err) {
      EXPECT_NE(std::string(err.what()).find(expected[name].get<std::string>()), std::string::npos)
          << name << ": " << err.what();
    }
  }
  EXPECT_EQ(files, expected.size());
}

// What older writers left, and what a newer one may add, still reads; re-encoded, an old
// Python record (indented, its own key order) is the golden record's bytes.
TEST(GoldenRecords, OlderAndOddRecordsStillReadAndReencodeToTheOneEncoding) {
  const std::string dir = kCases + "/records/valid";
  for (auto& e : fs::directory_iterator(dir))
    EXPECT_NO_THROW(ck::decodeRecord(slurp(e.path().string()))) << e.path();
  ck::CommitRecord old = ck::decodeRecord(slurp(dir + "/python-indent-1.json"));
  EXPECT_EQ(ck::encodeRecord(old),
            slurp(kCases + "/sharded/memory/rank-0/step-40/.ddpl-commit.json"));
  ck::CommitRecord anonymous = ck::decodeRecord(slurp(dir + "/epoch-0.json"));
  EXPECT_FALSE(anonymous.writer.known());
  EXPECT_EQ(ck::encodeRecord(anonymous).find("run_id"), std::string::npos);
  EXPECT_EQ(ck::decodeRecord(slurp(dir + "/time-integer.json")).time, 1733300000.0);
}

}  // namespace
