// ddp_resnet as users run it: real ranks over Gloo on loopback, started by `launch` or the
// pinned torchrun, judged by what rank 0 prints and the summary it writes. Budgets are small
// (a narrow ResNet-18, a few hundred images per rank); nothing here asserts on speed.
#include <gtest/gtest.h>

#include <filesystem>

#include "tests/common/subprocess.h"
#include "tests/integration/example_cifar_files.h"
#include "tests/integration/example_procs.h"

namespace et = ddpl::example::testing;
namespace dt = ddpl::testing;
namespace fs = std::filesystem;

namespace {

constexpr auto kRunTimeout = std::chrono::seconds(150);

class ExampleTraining : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = dt::makeTempDir("ddpl-example-train"); }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }

  dt::RunResult launch(const std::vector<std::string>& trainerArgs, int nproc = 2) {
    std::vector<std::string> argv{et::binary("launch"), "--standalone",
                                  "--nproc-per-node=" + std::to_string(nproc), et::trainer()};
    argv.insert(argv.end(), trainerArgs.begin(), trainerArgs.end());
    return dt::run(argv, options());
  }
  dt::RunOptions options() const {
    dt::RunOptions o;
    o.env = {{"OMP_NUM_THREADS", "1"}, {"DDPL_BACKEND", "gloo"}};
    o.timeout = kRunTimeout;
    return o;
  }
  // A small job: 2048 synthetic images, 32 per rank per step -> 32 steps per epoch on 2 ranks.
  std::vector<std::string> smallJob(int epochs) const {
    return {"--width",
            "8",
            "--train-size",
            "2048",
            "--test-size",
            "512",
            "--batch-size",
            "32",
            "--epochs",
            std::to_string(epochs),
            "--lr",
            "0.2",
            "--checkpoint-dir",
            dir_ + "/ckpt",
            "--summary-json",
            dir_ + "/summary.json",
            "--log-every",
            "8"};
  }
  std::string dir_;
};

TEST_F(ExampleTraining, TwoRanksLearnTheSyntheticSetWellAboveChance) {
  const auto r = launch(smallJob(3));
  ASSERT_FALSE(r.timed_out) << r.all();
  ASSERT_EQ(r.exit_code, 0) << r.all();
  const auto s = et::summary(dir_ + "/summary.json");
  ASSERT_FALSE(s.empty()) << r.all();
  EXPECT_EQ(s["world_size"], 2);
  EXPECT_EQ(s["backend"], "gloo");
  EXPECT_EQ(s["total_steps"], 3 * 32);
  EXPECT_EQ(s["final_step"], 3 * 32);
  EXPECT_EQ(s["test_images"], 512);
  // Ten classes: chance is 10%.
  EXPECT_GT(s["final_top1"].get<double>(), 0.35) << r.all();
  const auto& log = s["epoch_log"];
  ASSERT_EQ(log.size(), 3u);
  EXPECT_LT(log[2]["train_loss"].get<double>(), log[0]["train_loss"].get<double>()) << log.dump();
  // What the user reads: rank 0's lines only, progress, per-epoch results and the summary.
  EXPECT_NE(r.out.find("[default0]:epoch 1/3  step 8/32  loss "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[default0]:epoch 3/3 done: train loss "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[default0]:final test top-1: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[default0]:checkpoint: " + dir_ + "/ckpt/ckpt-step00000096.pt"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("[default1]:epoch"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(dir_ + "/ckpt/ckpt-step00000096.pt"));
  EXPECT_TRUE(fs::exists(dir_ + "/ckpt/ckpt-step00000064.pt"));  // --keep-checkpoints 2
  EXPECT_FALSE(fs::exists(dir_ + "/ckpt/ckpt-step00000032.pt"));
}

TEST_F(ExampleTraining, ReadsCifar10FilesShardedOverTwoRanks) {
  // 2 x 400 training records in two files, 200 test records: a reader that misaligned labels and
  // pixels would leave the network at chance.
  fs::create_directories(dir_ + "/cifar");
  et::writeCifarFile(dir_ + "/cifar/data_batch_1.bin", 400, 11);
  et::writeCifarFile(dir_ + "/cifar/data_batch_2.bin", 400, 12);
  et::writeCifarFile(dir_ + "/cifar/test_batch.bin", 200, 13);
  const auto r =
      launch({"--data", dir_ + "/cifar", "--width", "8", "--batch-size", "25", "--epochs", "3",
              "--lr", "0.1", "--checkpoint-dir", "", "--summary-json", dir_ + "/summary.json"});
  ASSERT_FALSE(r.timed_out) << r.all();
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.out.find("data: CIFAR-10: 800 train (2 files) / 200 test images, random crop + flip"),
            std::string::npos)
      << r.out;
  const auto s = et::summary(dir_ + "/summary.json");
  EXPECT_EQ(s["steps_per_epoch"], 16);  // 400 images per rank / 25
  EXPECT_EQ(s["test_images"], 200);
  EXPECT_EQ(s["checkpoint"], "");
  EXPECT_GT(s["final_top1"].get<double>(), 0.5) << r.all();
}

TEST_F(ExampleTraining, ResumesTheSameRunOrOnRequestAndStartsANewRunAfresh) {
  // A single rank without a launcher: the same program at world size 1, 64 steps per epoch.
  const auto runJob = [&](int epochs, const std::string& runId, bool resume) {
    dt::RunOptions o = options();
    o.env["TORCHELASTIC_RUN_ID"] = runId;
    std::vector<std::string> argv{et::trainer()};
    const auto job = smallJob(epochs);
    argv.insert(argv.end(), job.begin(), job.end());
    if (resume) argv.push_back("--resume");
    auto r = dt::run(argv, o);
    EXPECT_EQ(r.exit_code, 0) << r.all();
    return std::make_pair(r, et::summary(dir_ + "/summary.json"));
  };

  auto [r, s] = runJob(1, "job-a", false);
  EXPECT_EQ(s["final_step"], 64);

  // A new job with --resume continues; the first epoch is not repeated.
  std::tie(r, s) = runJob(2, "job-b", true);
  EXPECT_EQ(s["start_step"], 64);
  EXPECT_EQ(s["final_step"], 128);
  EXPECT_EQ(s["steps_this_run"], 64);
  EXPECT_EQ(s["resumed_from"], dir_ + "/ckpt/ckpt-step00000064.pt");
  EXPECT_EQ(s["epoch_log"].size(), 1u);
  EXPECT_NE(
      r.out.find("resumed from step 64 (disk: " + dir_ +
                 "/ckpt/ckpt-step00000064.pt), continuing at step 64/128 (--resume)"),
      std::string::npos)
      << r.out;

  // The same job started again (as after an elastic re-formation, which keeps the restart count
  // at 0) resumes without being asked.
  std::tie(r, s) = runJob(3, "job-b", false);
  EXPECT_EQ(s["start_step"], 128);
  EXPECT_EQ(s["final_step"], 192);
  EXPECT_NE(r.out.find("(run job-b started again)"), std::string::npos) << r.out;

  // A new job without --resume ignores (and removes) the earlier run's checkpoints.
  std::tie(r, s) = runJob(1, "job-c", false);
  EXPECT_NE(r.out.find("starting afresh: removed 2 checkpoint(s)"), std::string::npos) << r.out;
  EXPECT_EQ(s["start_step"], 0);
  EXPECT_EQ(s["final_step"], 64);
  EXPECT_FALSE(fs::exists(dir_ + "/ckpt/ckpt-step00000192.pt"));
}

TEST_F(ExampleTraining, ResumingFromAnotherModelsCheckpointIsAClearError) {
  const auto runJob = [&](const std::string& width, bool resume) {
    std::vector<std::string> argv{et::trainer(), "--width",     width, "--train-size",
                                  "128",         "--test-size", "32",  "--batch-size",
                                  "16",          "--epochs",    "1",   "--checkpoint-dir",
                                  dir_ + "/ckpt"};
    if (resume) argv.push_back("--resume");
    dt::RunOptions o = options();
    o.env["TORCHELASTIC_ERROR_FILE"] = dir_ + "/error.json";
    return dt::run(argv, o);
  };
  ASSERT_EQ(runJob("4", false).exit_code, 0);
  const auto r = runJob("8", true);
  EXPECT_EQ(r.exit_code, 1) << r.all();
  const auto error = nlohmann::json::parse(et::slurp(dir_ + "/error.json"));
  EXPECT_EQ(error["message"]["message"].get<std::string>(),
            "ddpl::InvalidArgument: cannot resume from " + dir_ +
                "/ckpt/ckpt-step00000008.pt (resume requested): parameter 'stem.conv.weight' has "
                "shape [4, 3, 3, 3] in the checkpoint but [8, 3, 3, 3] in this model; the file is "
                "complete, so it was written for another model or configuration (architecture, "
                "width, dtype): use another checkpoint directory, or start a new run without "
                "resuming");
  EXPECT_TRUE(fs::exists(dir_ + "/ckpt/ckpt-step00000008.pt"));  // left alone
}

// The resume rule's one exception to "newest only": a truncated newest checkpoint (damaged after
// it was written) is named as truncated and the next older complete one is used.
TEST_F(ExampleTraining, ATruncatedNewestCheckpointIsSkippedForTheNewestCompleteOne) {
  const auto runJob = [&](int epochs, bool resume) {
    std::vector<std::string> argv{et::trainer(), "--width", "4", "--train-size", "512",
                                  "--test-size", "64", "--batch-size", "32", "--epochs",
                                  std::to_string(epochs), "--checkpoint-dir", dir_ + "/ckpt",
                                  "--checkpoint-every", "4", "--keep-checkpoints", "3",
                                  "--summary-json", dir_ + "/summary.json"};
    if (resume) argv.push_back("--resume");
    return dt::run(argv, options());
  };
  auto r = runJob(1, false);  // 16 steps: checkpoints at 8, 12 and 16 are kept
  ASSERT_EQ(r.exit_code, 0) << r.all();
  const std::string newest = dir_ + "/ckpt/ckpt-step00000016.pt";
  ASSERT_TRUE(fs::exists(newest));
  fs::resize_file(newest, fs::file_size(newest) - 200);
  r = runJob(2, true);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.out.find("skipping checkpoint " + newest + ": truncated: "), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("resumed from step 12 (disk: " + dir_ +
                 "/ckpt/ckpt-step00000012.pt), continuing at step 12/32 (--resume)"),
            std::string::npos)
      << r.out;
  const auto s = et::summary(dir_ + "/summary.json");
  EXPECT_EQ(s["start_step"], 12);
  EXPECT_EQ(s["final_step"], 32);
}

// --auto-batch: out of memory at the first step (midway through rank 1's backward, some buckets
// already all-reduced), every rank switches from micro-batch 16 to 8 x 2 and the run ends with
// weights bit for bit those of a run started at 8 x 2. A run at 16 x 1 ends elsewhere (BatchNorm
// sees other batches), so the comparison can tell them apart.
TEST_F(ExampleTraining, OutOfMemoryAtTheFirstStepSwitchesEveryRankToTheSmallerMicroBatch) {
  const auto job = [&](const std::string& tag, const std::vector<std::string>& extra) {
    std::vector<std::string> args{"--width", "8", "--train-size", "512", "--test-size", "64",
                                  "--epochs", "1", "--lr", "0.1", "--checkpoint-dir", "",
                                  "--summary-json", dir_ + "/" + tag + ".json"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto r = launch(args);
    EXPECT_EQ(r.exit_code, 0) << r.all();
    return std::make_pair(r, et::summary(dir_ + "/" + tag + ".json"));
  };
  const auto [switched, s1] =
      job("switched", {"--batch-size", "16", "--auto-batch", "--inject-oom", "0:1:backward"});
  const auto [small, s2] = job("small", {"--batch-size", "8", "--accumulation", "2"});
  const auto [big, s3] = job("big", {"--batch-size", "16"});
  ASSERT_FALSE(s1.empty() || s2.empty() || s3.empty());
  EXPECT_EQ(s1["oom_switches"], 1);
  EXPECT_EQ(s1["micro_batch"], 8);
  EXPECT_EQ(s1["accumulation"], 2);
  EXPECT_EQ(s2["oom_switches"], 0);
  EXPECT_EQ(s1["global_batch"], 32);
  EXPECT_EQ(s2["global_batch"], 32);
  EXPECT_EQ(s1["final_step"], s2["final_step"]);
  EXPECT_EQ(s1["parameter_digest"], s2["parameter_digest"]);
  EXPECT_NE(s3["parameter_digest"], s2["parameter_digest"]);
  const std::string line =
      "rank 1 ran out of device memory at step 0 with micro-batch 16 x 1 accumulated: every rank "
      "continues with micro-batch 8 x 2 accumulated, global batch 32 unchanged; step 0 runs again";
  const std::string all = switched.all();
  const auto at = all.find(line);
  EXPECT_NE(at, std::string::npos) << all;
  EXPECT_EQ(all.find(line, at + 1), std::string::npos) << "said more than once:\n" << all;
}

// Mid-run, at the first step of epoch 2: wherever the error strikes (before rank 0's forward,
// midway through rank 1's backward, on both ranks at once), the abandoned step leaves nothing
// behind, so the runs end with the same weights; a run that never switched ends elsewhere.
// (Not compared with a run resumed from a checkpoint at 8 x 2: a resumed process is not bit for
// bit a continued one even without any switch, on this CPU build.)
TEST_F(ExampleTraining, OutOfMemoryMidRunEndsTheSameWhereverItStruck) {
  const auto job = [&](const std::string& tag, const std::vector<std::string>& extra) {
    std::vector<std::string> args{"--width", "8", "--train-size", "512", "--test-size", "64",
                                  "--lr", "0.1", "--epochs", "2", "--batch-size", "16",
                                  "--checkpoint-dir", "", "--summary-json",
                                  dir_ + "/" + tag + ".json"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto r = launch(args);
    EXPECT_EQ(r.exit_code, 0) << r.all();
    return et::summary(dir_ + "/" + tag + ".json");
  };
  // 256 images per rank, 16 steps an epoch: step 16 opens epoch 2.
  const auto forward0 = job("forward0", {"--auto-batch", "--inject-oom", "16:0:forward"});
  const auto backward1 = job("backward1", {"--auto-batch", "--inject-oom", "16:1:backward"});
  const auto both = job("both", {"--auto-batch", "--inject-oom", "16:-1:backward"});
  const auto never = job("never", {"--auto-batch"});
  ASSERT_FALSE(forward0.empty() || backward1.empty() || both.empty() || never.empty());
  for (const auto* s : {&forward0, &backward1, &both}) {
    EXPECT_EQ((*s)["oom_switches"], 1);
    EXPECT_EQ((*s)["micro_batch"], 8);
    EXPECT_EQ((*s)["final_step"], 32);
  }
  EXPECT_EQ(never["oom_switches"], 0);
  EXPECT_EQ(forward0["parameter_digest"], backward1["parameter_digest"]);
  EXPECT_EQ(forward0["parameter_digest"], both["parameter_digest"]);
  EXPECT_NE(forward0["parameter_digest"], never["parameter_digest"]);
}

// The other architecture and the switches on CPU: bottleneck blocks behind the ImageNet stem,
// bf16 autocast, channels-last and gradient accumulation together, through DDP and a resume.
TEST_F(ExampleTraining, BottleneckResNet50WithAmpChannelsLastAndAccumulation) {
  const auto job = [&](const std::string& epochs) {
    return std::vector<std::string>{"--model",
                                    "resnet50",
                                    "--width",
                                    "4",
                                    "--image-size",
                                    "64",
                                    "--stem",
                                    "imagenet",
                                    "--train-size",
                                    "256",
                                    "--test-size",
                                    "64",
                                    "--batch-size",
                                    "16",
                                    "--accumulation",
                                    "2",
                                    "--amp",
                                    "bf16",
                                    "--channels-last",
                                    "--epochs",
                                    epochs,
                                    "--checkpoint-dir",
                                    dir_ + "/ckpt",
                                    "--summary-json",
                                    dir_ + "/summary.json"};
  };
  auto r = launch(job("1"));
  ASSERT_FALSE(r.timed_out) << r.all();
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.out.find("resnet50 (width 4, "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ImageNet stem) on 2 ranks, cpu/gloo, amp bf16, channels-last"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("global batch 64 (16 per rank x 2 accumulated)"), std::string::npos)
      << r.out;
  auto s = et::summary(dir_ + "/summary.json");
  EXPECT_EQ(s["final_step"], 4);  // 128 images per rank / (16 x 2)
  // The switches as torch holds them (the GPU checks judge fp16, TF32 and cuDNN by these).
  EXPECT_EQ(s["amp"], "bf16");
  EXPECT_EQ(s["channels_last"], true);
  EXPECT_EQ(s["tf32_matmul"], false);
  EXPECT_TRUE(s["grad_scale"].is_null()) << s.dump();  // the scaler runs in fp16 only
  const double loss = s["epoch_log"][0]["train_loss"].get<double>();
  EXPECT_TRUE(loss > 0 && loss < 10) << loss;
  // The checkpoint of this model loads back: a second epoch resumes from it.
  auto more = job("2");
  more.push_back("--resume");
  r = launch(more);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  s = et::summary(dir_ + "/summary.json");
  EXPECT_EQ(s["start_step"], 4);
  EXPECT_EQ(s["final_step"], 8);
}

TEST_F(ExampleTraining, RunsUnderThePinnedTorchrun) {
  if (!fs::exists(et::torchrun())) GTEST_SKIP() << "no torchrun next to " << DDPL_PYTHON;
  std::vector<std::string> argv{et::torchrun(), "--standalone", "--nproc-per-node=2", "--no-python",
                                et::trainer()};
  const auto job = smallJob(1);
  argv.insert(argv.end(), job.begin(), job.end());
  const auto r = dt::run(argv, options());
  ASSERT_FALSE(r.timed_out) << r.all();
  ASSERT_EQ(r.exit_code, 0) << r.all();
  const auto s = et::summary(dir_ + "/summary.json");
  EXPECT_EQ(s["world_size"], 2);
  EXPECT_EQ(s["final_step"], 32);
  EXPECT_GT(s["final_top1"].get<double>(), 0.0);
  // torchrun's TCPStore (hosted by its agent), not our gRPC store: the worker found it alone.
  EXPECT_EQ(r.all().find("ddplaunch rendezvous store"), std::string::npos) << r.all();
}

}  // namespace
