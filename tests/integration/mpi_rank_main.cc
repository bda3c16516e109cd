// One rank of the MPI tests (tests/integration/mpi_launch_test.cc): the same binary runs under
// `launch`, plain mpirun and `launch --launcher=mpi`, and leaves what the driver compares.
//
//   mpi_rank train DIR   DDP on an MLP for a few steps; writes DIR/rank.<R> (how the rank was
//                        bootstrapped) and DIR/params.<R> (every final parameter, as exact
//                        hexadecimal floats, so that two launches compare byte for byte)
//   mpi_rank fail DIR    writes DIR/pid.<R>; rank 1 then exits with status 3, the others wait
//                        60 s for a failure that should end them long before
#include <torch/torch.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <thread>

#include "common/errors.h"
#include "worker/ddp.h"
#include "worker/session.h"

namespace dw = ddpl::worker;

namespace {

constexpr int kSteps = 4;
constexpr int kPerRankBatch = 4;

int train(dw::Session& session, const std::string& dir) {
  const int rank = session.rank(), world = session.worldSize();
  {
    const auto& o = session.options();
    std::ofstream(dir + "/rank." + std::to_string(rank))
        << "rank " << rank << " world " << world << " local " << o.local_rank << "/"
        << o.local_world_size << " bootstrap " << (o.mpi_bootstrap ? "mpi" : "env") << " backend "
        << dw::toString(session.backendKind()) << "\n";
  }
  torch::manual_seed(4321 + rank);  // different on purpose: DDP broadcasts rank 0's weights
  auto model = torch::nn::Sequential(torch::nn::Linear(6, 12), torch::nn::Tanh(), torch::nn::Linear(12, 2));
  dw::DistributedDataParallel<torch::nn::SequentialImpl> ddp(model.ptr(), session.backend());
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  for (int step = 0; step < kSteps; ++step) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(77 + step);
    auto x = torch::randn({world * kPerRankBatch, 6}, gen);
    auto y = torch::randn({world * kPerRankBatch, 2}, gen);
    opt.zero_grad();
    auto loss = torch::mse_loss(ddp.forward(x.narrow(0, rank * kPerRankBatch, kPerRankBatch)),
                                y.narrow(0, rank * kPerRankBatch, kPerRankBatch));
    loss.backward();
    opt.step();
  }
  std::FILE* out = std::fopen((dir + "/params." + std::to_string(rank)).c_str(), "w");
  if (!out) throw std::runtime_error("cannot write to " + dir);
  for (const auto& item : model->named_parameters()) {
    auto flat = item.value().detach().to(torch::kDouble).contiguous().view(-1);
    std::fprintf(out, "%s", item.key().c_str());
    const double* values = flat.data_ptr<double>();
    for (int64_t i = 0; i < flat.numel(); ++i) std::fprintf(out, " %a", values[i]);
    std::fprintf(out, "\n");
  }
  std::fclose(out);
  return 0;
}

int fail(dw::Session& session, const std::string& dir) {
  std::ofstream(dir + "/pid." + std::to_string(session.rank())) << ::getpid() << "\n";
  // Slow on purpose: mpirun must still wait for it (or kill it), never leave it running.
  session.addCleanupHook("marker", [dir](dw::Session& s) {
    std::this_thread::sleep_for(std::chrono::seconds(5));
    std::ofstream(dir + "/cleanup." + std::to_string(s.rank())) << "cleanup ran\n";
  });
  session.barrier();  // every rank is up and has written its pid
  if (session.rank() == 1) {
    std::cerr << "rank 1: exiting with status 3 on purpose" << std::endl;
    std::exit(3);
  }
  std::this_thread::sleep_for(std::chrono::seconds(60));
  return 5;  // mpirun should have ended us long before
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: mpi_rank train|fail DIR" << std::endl;
    return 2;
  }
  const std::string scenario = argv[1], dir = argv[2];
  try {
    dw::SessionOptions options = dw::SessionOptions::fromEnvironment();
    options.backend = dw::BackendKind::kGloo;
    options.collective_timeout = std::chrono::seconds(60);
    options.store_timeout = std::chrono::seconds(60);
    dw::Session session(options);
    if (scenario == "train") return train(session, dir);
    if (scenario == "fail") return fail(session, dir);
    throw ddpl::InvalidArgument("unknown scenario '" + scenario + "'");
  } catch (const std::exception& e) {
    std::cerr << "mpi_rank: error: " << e.what() << std::endl;
    return 1;
  }
}
