// What a user feeds ddp_resnet: the command line, CIFAR-10 files (reader cases in process; a
// truncated file and bad flags through the real binary, which must fail before any process
// group exists), and what it shows back (progress formatting). All torch-free drivers.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "examples/ddp_resnet/cifar10.h"
#include "examples/ddp_resnet/options.h"
#include "examples/ddp_resnet/progress.h"
#include "tests/common/subprocess.h"
#include "tests/integration/example_cifar_files.h"
#include "tests/integration/example_procs.h"

namespace ex = ddpl::example;
namespace fs = std::filesystem;

namespace {

std::string errorOf(const std::vector<std::string>& args) {
  try {
    ex::parseOptions(args);
  } catch (const ex::UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(ExampleOptions, ParsesBothSpellingsAndEqualsForm) {
  const auto o = ex::parseOptions({"--model", "resnet50", "--batch_size=16", "--lr", "0.05",
                                   "--channels-last", "--amp=bf16", "--accumulation", "4",
                                   "--resume", "--augment=0", "--checkpoint-dir="});
  EXPECT_EQ(o.model, ex::ModelKind::kResNet50);
  EXPECT_EQ(o.batch_size, 16);
  EXPECT_DOUBLE_EQ(o.lr, 0.05);
  EXPECT_TRUE(o.channels_last);
  EXPECT_EQ(o.amp, ex::AmpMode::kBf16);
  EXPECT_EQ(o.accumulation, 4);
  EXPECT_TRUE(o.resume);
  EXPECT_FALSE(o.augment);
  EXPECT_EQ(o.checkpoint_dir, "");
}

TEST(ExampleOptions, DefaultsAreTheDemo) {
  const auto o = ex::parseOptions({});
  EXPECT_EQ(o.model, ex::ModelKind::kResNet18);
  EXPECT_EQ(o.width, ex::kDefaultWidth);
  EXPECT_TRUE(o.data_dir.empty());
  EXPECT_EQ(o.amp, ex::AmpMode::kOff);
  EXPECT_FALSE(o.resume);
}

TEST(ExampleOptions, ErrorsNameTheFlag) {
  EXPECT_EQ(errorOf({"--epochs", "abc"}),
            "--epochs: 'abc' is not a whole number (expected 1 to 1000000000)");
  EXPECT_EQ(errorOf({"--epochs", "0"}),
            "--epochs: 0 is out of range: use a whole number from 1 to 1000000000");
  EXPECT_EQ(errorOf({"--model", "resnet19"}),
            "--model: 'resnet19' is not one of resnet18, resnet34, resnet50");
  EXPECT_EQ(errorOf({"--bogus"}), "unknown option '--bogus' (see --help)");
  EXPECT_EQ(errorOf({"--lr"}), "--lr: needs a value (X)");
  EXPECT_EQ(errorOf({"--lr", "nan"}).rfind("--lr: 'nan' is not a number", 0), 0u);
  EXPECT_EQ(errorOf({"--amp", "int8"}), "--amp: 'int8' is not one of off, bf16, fp16");
  EXPECT_EQ(errorOf({"--channels-last=maybe"}),
            "--channels-last: 'maybe' is not a boolean (use 1/0, true/false, yes/no or on/off)");
  EXPECT_EQ(errorOf({"train.py"}), "unexpected argument 'train.py' (options start with --)");
  EXPECT_EQ(errorOf({"--data", "/d", "--classes", "5"}),
            "--classes: CIFAR-10 has 10 classes; --classes applies to the synthetic set only");
  EXPECT_NE(errorOf({"--lr", "0.1", "--min-lr", "0.2"}).find("--min-lr"), std::string::npos);
}

TEST(ExampleOptions, UsageListsEveryFlag) {
  const auto text = ex::usage();
  for (const char* flag :
       {"--model", "--data", "--epochs", "--batch-size", "--lr", "--warmup-epochs", "--momentum",
        "--weight-decay", "--accumulation", "--seed", "--checkpoint-dir", "--checkpoint-every",
        "--resume", "--amp", "--channels-last", "--backend"}) {
    EXPECT_NE(text.find(flag), std::string::npos) << flag;
  }
}

TEST(ExampleProgress, FormatsDurations) {
  EXPECT_EQ(ex::formatDuration(0), "0s");
  EXPECT_EQ(ex::formatDuration(42.4), "42s");
  EXPECT_EQ(ex::formatDuration(185), "3m05s");
  EXPECT_EQ(ex::formatDuration(3720), "1h02m");
  EXPECT_EQ(ex::formatDuration(-1), "?");
}

TEST(ExampleProgress, LinesWhenNotATerminal) {
  char* buf = nullptr;
  size_t size = 0;
  FILE* out = ::open_memstream(&buf, &size);
  {
    ex::ProgressReporter p(ex::ProgressMode::kAuto, true, 5, out);
    EXPECT_FALSE(p.usesBar());
    EXPECT_FALSE(p.wantsUpdate(3, 20));
    EXPECT_TRUE(p.wantsUpdate(5, 20));
    EXPECT_TRUE(p.wantsUpdate(20, 20));  // the end of an epoch always shows
    ex::StepStats s;
    s.epoch = 2, s.epochs = 4, s.step_in_epoch = 5, s.steps_per_epoch = 20, s.loss = 1.25,
    s.lr = 0.1;
    s.images_per_second = 300, s.eta_seconds = 65;
    p.update(s);
    p.line("done");
  }
  std::fclose(out);
  EXPECT_EQ(std::string(buf, size),
            "epoch 2/4  step 5/20  loss 1.2500  lr 0.1000  300 img/s  ETA 1m05s\ndone\n");
  std::free(buf);
}

TEST(ExampleProgress, OtherRanksAreSilent) {
  char* buf = nullptr;
  size_t size = 0;
  FILE* out = ::open_memstream(&buf, &size);
  {
    ex::ProgressReporter p(ex::ProgressMode::kBar, false, 1, out);
    EXPECT_FALSE(p.wantsUpdate(1, 1));
    p.line("nothing");
  }
  std::fclose(out);
  EXPECT_EQ(size, 0u);
  std::free(buf);
}

class ExampleCifarReader : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("ddpl-cifar-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string loadError() const {
    try {
      ex::loadCifar10(dir_.string());
    } catch (const ex::DataError& e) {
      return e.what();
    }
    return "";
  }
  fs::path dir_;
};

TEST_F(ExampleCifarReader, ReadsRecordsInOrderWithLabelsAndPlanarPixels) {
  ex::testing::writeCifarFile(path("data_batch_1.bin"), 12, 1);
  ex::testing::writeCifarFile(path("data_batch_2.bin"), 7, 2);
  ex::testing::writeCifarFile(path("data_batch_10.bin"), 3, 3);  // numeric, not lexical, order
  ex::testing::writeCifarFile(path("test_batch.bin"), 5, 4);
  ex::testing::writeCifarFile(path("data_batch_x.bin"), 1, 5);  // not a batch name: ignored
  const auto data = ex::loadCifar10(dir_.string());
  ASSERT_EQ(data.train.count, 22);
  ASSERT_EQ(data.train_files.size(), 3u);
  EXPECT_EQ(data.train_files[2], path("data_batch_10.bin"));
  EXPECT_EQ(data.test.count, 5);
  ASSERT_EQ(data.train.pixels.size(), 22u * 3072);
  // Record 13 is the second record of data_batch_2.bin (seed 2): compare byte by byte.
  std::mt19937 rng(2);
  ex::testing::cifarRecord(0, rng);
  const auto expected = ex::testing::cifarRecord(1, rng);
  EXPECT_EQ(data.train.labels[13], 1);
  for (int c = 0; c < 3; ++c) {
    for (int y : {0, 3, 31}) {
      for (int x : {0, 17, 31}) {
        EXPECT_EQ(data.train.pixels[13 * 3072 + c * 1024 + y * 32 + x],
                  expected[1 + c * 1024 + y * 32 + x]);
      }
    }
  }
  for (int i = 0; i < 12; ++i) EXPECT_EQ(data.train.labels[i], i % 10);
}

TEST_F(ExampleCifarReader, TruncatedFileIsAClearError) {
  ex::testing::writeCifarFile(path("data_batch_1.bin"), 4, 1);
  ex::testing::writeCifarFile(path("test_batch.bin"), 4, 1);
  fs::resize_file(path("data_batch_1.bin"), 4 * 3073 - 100);
  EXPECT_EQ(
      loadError(),
      path("data_batch_1.bin") +
          ": 12192 bytes is not a whole number of 3073-byte CIFAR-10 records (3 full records and "
          "2973 bytes over): truncated or not CIFAR-10 binary format");
}

TEST_F(ExampleCifarReader, MalformedLabelIsAClearError) {
  ex::testing::writeCifarFile(path("data_batch_1.bin"), 4, 1);
  ex::testing::writeCifarFile(path("test_batch.bin"), 4, 1);
  {
    std::fstream f(path("data_batch_1.bin"), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(2 * 3073);
    f.put(static_cast<char>(200));
  }
  EXPECT_EQ(
      loadError(),
      path("data_batch_1.bin") +
          ": record 2 has label 200, but CIFAR-10 labels are 0-9: not CIFAR-10 binary format");
}

TEST_F(ExampleCifarReader, MissingPiecesAreClearErrors) {
  EXPECT_NE(loadError().find("no data_batch_<n>.bin files"), std::string::npos) << loadError();
  ex::testing::writeCifarFile(path("data_batch_1.bin"), 2, 1);
  EXPECT_EQ(loadError(),
            "--data " + dir_.string() + ": test_batch.bin is missing (needed for evaluation)");
  std::ofstream(path("test_batch.bin"));  // empty
  EXPECT_EQ(loadError(),
            path("test_batch.bin") + ": empty file (expected 3073-byte CIFAR-10 records)");
  fs::remove_all(dir_);
  EXPECT_EQ(loadError(), "--data " + dir_.string() + ": No such file or directory");
}

// The binary itself: every bad input is one line naming the problem and exit code 2, before
// any process group exists.
namespace et = ddpl::example::testing;
namespace dt = ddpl::testing;

class ExampleBinary : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = dt::makeTempDir("ddpl-example-input"); }
  void TearDown() override { fs::remove_all(dir_); }
  // One rank of a two-rank job whose peer never comes: a process group would wait minutes for
  // it, so a prompt exit shows that the check ran first.
  dt::RunResult runAsRank0(const std::vector<std::string>& args) {
    std::vector<std::string> argv{et::trainer()};
    argv.insert(argv.end(), args.begin(), args.end());
    dt::RunOptions o;
    o.env = {{"RANK", "0"},
             {"LOCAL_RANK", "0"},
             {"WORLD_SIZE", "2"},
             {"LOCAL_WORLD_SIZE", "2"},
             {"MASTER_ADDR", "127.0.0.1"},
             {"MASTER_PORT", std::to_string(et::freePort())},
             {"DDPL_BACKEND", "gloo"},
             {"TORCHELASTIC_ERROR_FILE", dir_ + "/error.json"}};
    o.unset_env = {"DDPL_STORE_ADDR", "TORCHELASTIC_USE_AGENT_STORE"};
    o.timeout = std::chrono::seconds(60);
    return dt::run(argv, o);
  }
  std::string dir_;
};

TEST_F(ExampleBinary, BadFlagsNameTheFlagAndExit2) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--epochs", "abc"},
       "ddp_resnet: --epochs: 'abc' is not a whole number (expected 1 to 1000000000)\n"},
      {{"--model", "resnet19"},
       "ddp_resnet: --model: 'resnet19' is not one of resnet18, resnet34, resnet50\n"},
      {{"--frobnicate"}, "ddp_resnet: unknown option '--frobnicate' (see --help)\n"},
      {{"--batch-size", "5000"},
       "ddp_resnet: --batch-size: 5000 is more than each rank's share of the 8192 training images "
       "(4096 on each of 2 "
       "ranks)\n"},
  };
  for (const auto& [args, message] : cases) {
    const auto r = runAsRank0(args);
    EXPECT_FALSE(r.timed_out);
    EXPECT_EQ(r.exit_code, 2) << r.all();
    EXPECT_EQ(r.err, message);
  }
  // The launcher's failure report reads the torchrun error file.
  const auto error = nlohmann::json::parse(et::slurp(dir_ + "/error.json"));
  EXPECT_NE(error["message"]["message"].get<std::string>().find("--batch-size: 5000"),
            std::string::npos);
}

TEST_F(ExampleBinary, HelpListsOptionsAndExits0) {
  const auto r = dt::run({et::trainer(), "--help"});
  EXPECT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.out.find("--checkpoint-dir DIR"), std::string::npos) << r.out;
}

TEST_F(ExampleBinary, TruncatedCifarFileFailsBeforeAnyProcessGroup) {
  et::writeCifarFile(dir_ + "/data_batch_1.bin", 20, 1);
  et::writeCifarFile(dir_ + "/data_batch_2.bin", 20, 2);
  et::writeCifarFile(dir_ + "/test_batch.bin", 10, 3);
  fs::resize_file(dir_ + "/data_batch_2.bin", 20 * 3073 - 1);
  const auto started = std::chrono::steady_clock::now();
  const auto r = runAsRank0({"--data", dir_});
  EXPECT_FALSE(r.timed_out) << "waited for a peer: the data check did not come first";
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(30));
  EXPECT_EQ(r.exit_code, 2) << r.all();
  EXPECT_EQ(r.err, "ddp_resnet: " + dir_ +
                       "/data_batch_2.bin: 61459 bytes is not a whole number of 3073-byte CIFAR-10 "
                       "records (19 full "
                       "records and 3072 bytes over): truncated or not CIFAR-10 binary format\n");
  EXPECT_EQ(r.out, "");  // nothing started: no banner, no process-group log
}

TEST_F(ExampleBinary, MissingDataDirectoryFailsBeforeAnyProcessGroup) {
  const auto r = runAsRank0({"--data", dir_ + "/nope"});
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 2) << r.all();
  EXPECT_EQ(r.err, "ddp_resnet: --data " + dir_ + "/nope: No such file or directory\n");
}

}  // namespace
