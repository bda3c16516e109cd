// Recognising an MPI launch from its variables (worker/mpi_env.h): torch-free, no MPI needed.
#include <gtest/gtest.h>

#include "common/errors.h"
#include "worker/mpi_env.h"

namespace dw = ddpl::worker;

namespace {

std::string invalid(const dw::Environment& env) {
  try {
    dw::detectMpiLaunch(env);
  } catch (const ddpl::InvalidArgument& e) {
    return e.what();
  }
  return "(no InvalidArgument)";
}

TEST(MpiEnv, NoLauncherVariablesIsNoMpiLaunch) {
  EXPECT_FALSE(dw::detectMpiLaunch({}).has_value());
  EXPECT_FALSE(dw::detectMpiLaunch({{"RANK", "1"}, {"WORLD_SIZE", "2"}}).has_value());
  // A batch script's own process (no job step) is not a rank.
  EXPECT_FALSE(dw::detectMpiLaunch({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}}).has_value());
}

TEST(MpiEnv, OpenMpi) {
  const auto l = dw::detectMpiLaunch({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                                      {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                      {"PMIX_RANK", "3"}, {"SLURM_PROCID", "0"}, {"SLURM_STEP_ID", "0"}});
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->source, "OpenMPI");
  EXPECT_EQ(l->rank, 3);
  EXPECT_EQ(l->world_size, 4);
  EXPECT_EQ(l->local_rank, 1);
  EXPECT_EQ(l->local_world_size, 2);
  EXPECT_EQ(l->variables,
            "OMPI_COMM_WORLD_RANK=3 OMPI_COMM_WORLD_SIZE=4 OMPI_COMM_WORLD_LOCAL_RANK=1 OMPI_COMM_WORLD_LOCAL_SIZE=2");
}

TEST(MpiEnv, PmiPmixAndSlurm) {
  auto pmi = dw::detectMpiLaunch({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}, {"MPI_LOCALRANKID", "1"},
                                  {"MPI_LOCALNRANKS", "2"}});
  ASSERT_TRUE(pmi);
  EXPECT_EQ(pmi->source, "PMI");
  EXPECT_EQ(pmi->local_rank, 1);

  auto pmix = dw::detectMpiLaunch({{"PMIX_RANK", "5"}});
  ASSERT_TRUE(pmix);
  EXPECT_EQ(pmix->rank, 5);
  EXPECT_FALSE(pmix->world_size.has_value());  // MPI_Comm_size tells

  auto srunPmix = dw::detectMpiLaunch({{"PMIX_RANK", "2"}, {"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "4"},
                                       {"SLURM_LOCALID", "0"}, {"SLURM_STEP_ID", "0"}});
  ASSERT_TRUE(srunPmix);
  EXPECT_EQ(srunPmix->source, "PMIx");
  EXPECT_EQ(srunPmix->world_size, 4);
  EXPECT_EQ(srunPmix->local_rank, 0);
  EXPECT_FALSE(srunPmix->local_world_size.has_value());

  auto srun = dw::detectMpiLaunch({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "1"},
                                   {"SLURM_STEP_ID", "3"}});
  ASSERT_TRUE(srun);
  EXPECT_EQ(srun->source, "Slurm");
  EXPECT_EQ(srun->rank, 1);
  EXPECT_EQ(srun->world_size, 2);
}

TEST(MpiEnv, PartialOrInconsistentSetsAreErrorsNamingTheVariables) {
  EXPECT_EQ(invalid({{"OMPI_COMM_WORLD_RANK", "1"}}),
            "a partial OpenMPI environment: OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is not; start the "
            "program with the launcher's own tool (mpirun, srun) or unset the OpenMPI variables");
  EXPECT_EQ(invalid({{"OMPI_COMM_WORLD_SIZE", "2"}}).rfind(
                "a partial OpenMPI environment: OMPI_COMM_WORLD_SIZE is set but OMPI_COMM_WORLD_RANK is not", 0),
            0u);
  EXPECT_EQ(invalid({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "2"}}),
            "OMPI_COMM_WORLD_RANK=2 is not below OMPI_COMM_WORLD_SIZE=2 (OMPI_COMM_WORLD_RANK=2 OMPI_COMM_WORLD_SIZE=2)");
  EXPECT_EQ(invalid({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "0"}}).rfind(
                "OMPI_COMM_WORLD_SIZE must be >= 1", 0),
            0u);
  EXPECT_EQ(invalid({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                     {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}}).rfind(
                "a partial OpenMPI environment: OMPI_COMM_WORLD_LOCAL_RANK is set but OMPI_COMM_WORLD_LOCAL_SIZE", 0),
            0u);
  EXPECT_EQ(invalid({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                     {"OMPI_COMM_WORLD_LOCAL_RANK", "2"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}).rfind(
                "OMPI_COMM_WORLD_LOCAL_RANK=2 is not below OMPI_COMM_WORLD_LOCAL_SIZE=2", 0),
            0u);
  EXPECT_EQ(invalid({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                     {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"}}).rfind(
                "OMPI_COMM_WORLD_LOCAL_SIZE=3 exceeds OMPI_COMM_WORLD_SIZE=2", 0),
            0u);
  EXPECT_EQ(invalid({{"OMPI_COMM_WORLD_RANK", "one"}, {"OMPI_COMM_WORLD_SIZE", "2"}}),
            "environment variable OMPI_COMM_WORLD_RANK='one' is not a whole number >= 0");
  EXPECT_EQ(invalid({{"PMI_SIZE", "4"}}).rfind("a partial PMI environment: PMI_SIZE is set but PMI_RANK is not", 0), 0u);
  EXPECT_EQ(invalid({{"SLURM_NTASKS", "4"}, {"SLURM_STEP_ID", "0"}})
                .rfind("a partial Slurm environment: SLURM_NTASKS is set but SLURM_PROCID is not", 0),
            0u);
  EXPECT_EQ(invalid({{"PMIX_RANK", "1"}, {"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "4"}, {"SLURM_STEP_ID", "0"}}),
            "PMIX_RANK=1 but SLURM_PROCID=2: inconsistent MPI environment");
}

TEST(MpiEnv, BootstrapModeNames) {
  EXPECT_EQ(dw::parseBootstrapMode(""), dw::BootstrapMode::kAuto);
  EXPECT_EQ(dw::parseBootstrapMode("env"), dw::BootstrapMode::kEnv);
  EXPECT_EQ(dw::parseBootstrapMode("mpi"), dw::BootstrapMode::kMpi);
  EXPECT_THROW(dw::parseBootstrapMode("pmi"), ddpl::InvalidArgument);
}

}  // namespace
