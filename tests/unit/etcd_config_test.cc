// --rdzv-backend=etcd's settings: torchrun's keys and ours, from the command line as `launch`
// parses it, with secrets from files or the environment only.
#include "launcher/membership/etcd/etcd_config.h"

#include <gtest/gtest.h>

#include <fstream>

#include "common/errors.h"
#include "launcher/cli/cli.h"

using namespace ddpl::launcher;
using ddpl::UsageError;

namespace {

EtcdRendezvousConfig config(std::vector<std::string> args, ddpl::Environment env = {}) {
  args.push_back("p");
  ParseResult r = parseCommandLine(args, env);
  validateTopology(r.options);
  return etcdRendezvousConfig(r.options, RoundsConfig{}, env);
}

std::string error(std::vector<std::string> args, ddpl::Environment env = {}) {
  try {
    config(std::move(args), std::move(env));
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(EtcdConfig, EndpointsDefaultsAndTorchrunNames) {
  auto c = config({"--nnodes=2", "--rdzv-backend=etcd-v2",
                   "--rdzv-endpoint=http://a:2379,b,[::1]:2380", "--rdzv-id=j"});
  EXPECT_EQ(c.etcd.endpoints, (std::vector<std::string>{"a:2379", "b:2379", "[::1]:2380"}));
  EXPECT_EQ(c.prefix, "/ddplaunch");
  EXPECT_EQ(c.lease_ttl, kDefaultEtcdLeaseTtl);
  EXPECT_EQ(c.etcd.connect_timeout, std::chrono::seconds(10));
  EXPECT_TRUE(c.etcd.ca_file.empty());

  c = config({"--nnodes=2", "--rdzv-backend=etcd", "--rdzv-endpoint=a",
              "--rdzv-conf=protocol=https,cacert=ca.pem,cert=c.pem,key=k.pem,etcd_prefix=/x,"
              "lease_ttl=4,connect_timeout=1.5"});
  EXPECT_EQ(c.etcd.ca_file, "ca.pem");
  EXPECT_EQ(c.etcd.cert_file, "c.pem");
  EXPECT_EQ(c.etcd.key_file, "k.pem");
  EXPECT_EQ(c.prefix, "/x");
  EXPECT_EQ(c.lease_ttl, std::chrono::seconds(4));
  EXPECT_EQ(c.etcd.connect_timeout, std::chrono::milliseconds(1500));
}

TEST(EtcdConfig, BadCombinationsAreUsageErrors) {
  const std::vector<std::string> base = {"--nnodes=2", "--rdzv-backend=etcd"};
  auto with = [&](std::vector<std::string> more) {
    auto a = base;
    a.insert(a.end(), more.begin(), more.end());
    return error(a);
  };
  EXPECT_NE(with({}).find("--rdzv-endpoint"), std::string::npos);
  EXPECT_NE(with({"--rdzv-endpoint=a", "--rdzv-conf=protocol=https"}).find("cacert"), std::string::npos);
  EXPECT_NE(with({"--rdzv-endpoint=https://a", "--rdzv-conf=protocol=http"}).find("disagrees"),
            std::string::npos);
  EXPECT_NE(with({"--rdzv-endpoint=a", "--rdzv-conf=cacert=c,cert=x"}).find("together"), std::string::npos);
  EXPECT_NE(with({"--rdzv-endpoint=a", "--rdzv-conf=etcd_prefix=x"}).find("start with /"), std::string::npos);
  EXPECT_NE(with({"--rdzv-endpoint=a:99999"}).find("99999"), std::string::npos);
}

// The password never comes from the command line: a file, or the environment.
TEST(EtcdConfig, PasswordFromAFileOrTheEnvironmentOnly) {
  std::string file = ::testing::TempDir() + "/etcd-password";
  std::ofstream(file) << "s3cret\n";
  auto c = config({"--nnodes=2", "--rdzv-backend=etcd", "--rdzv-endpoint=a",
                   "--rdzv-conf=user=bob,password_file=" + file});
  EXPECT_EQ(c.etcd.user, "bob");
  EXPECT_EQ(c.etcd.password, "s3cret");
  c = config({"--nnodes=2", "--rdzv-backend=etcd", "--rdzv-endpoint=a", "--rdzv-conf=user=bob"},
             {{"DDPL_ETCD_PASSWORD", "pw"}});
  EXPECT_EQ(c.etcd.password, "pw");
  EXPECT_NE(error({"--nnodes=2", "--rdzv-backend=etcd", "--rdzv-endpoint=a", "--rdzv-conf=user=bob"})
                .find("password_file"),
            std::string::npos);
  // "password" is not a key: warned about as unknown, never used.
  auto r = parseCommandLine({"--rdzv-conf=password=x", "p"}, {});
  ASSERT_EQ(r.options.warnings.size(), 1u);
  EXPECT_NE(r.options.warnings[0].find("unknown key 'password'"), std::string::npos);
  EXPECT_TRUE(r.options.rdzv_conf.etcd.empty());
}
