// common/parse.h: the one checked parser every program uses.
#include "common/parse.h"

#include <gtest/gtest.h>

#include <functional>
#include <limits>

using namespace ddpl;

namespace {
std::string error(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "<no error>";
}
}  // namespace

TEST(Parse, Integers) {
  EXPECT_EQ(parseInteger("--n", "42"), 42);
  EXPECT_EQ(parseInteger("--n", "+7", 0, 10), 7);
  EXPECT_EQ(parseInteger("--n", "-5", -10, 10), -5);
  EXPECT_EQ(parseInteger("--n", "9223372036854775807"), std::numeric_limits<int64_t>::max());
  EXPECT_NE(error([] { parseInteger("--n", "9223372036854775808"); }).find("out of range"),
            std::string::npos);
  EXPECT_NE(error([] { parseInteger("--n", "11", 0, 10); }).find("--n: 11 is out of range"),
            std::string::npos);
  for (const char* bad : {"", " 1", "1 ", "1x", "0x10", "1.0", "--1", "+"})
    EXPECT_NE(error([&] { parseInteger("VAR", bad); }).find("VAR: '"), std::string::npos) << bad;
}

TEST(Parse, NumbersAndBooleans) {
  EXPECT_DOUBLE_EQ(parseNumber("--t", "0.25", 0, 1), 0.25);
  EXPECT_DOUBLE_EQ(parseNumber("--t", "1e3", 0, 1e9), 1000);
  for (const char* bad : {"nan", "inf", "1e999", "-1", "", "1s", " 1"})
    EXPECT_NE(error([&] { parseNumber("--t", bad, 0, 1e9); }).find("--t"), std::string::npos)
        << bad;
  for (const char* t : {"1", "true", "YES", "On"}) EXPECT_TRUE(parseBool("--b", t)) << t;
  for (const char* f : {"0", "false", "No", "off", ""}) EXPECT_FALSE(parseBool("--b", f)) << f;
  EXPECT_NE(error([] { parseBool("--b", "maybe"); }).find("--b: 'maybe' is not a boolean"),
            std::string::npos);
}

TEST(Parse, PortsAndEndpoints) {
  EXPECT_EQ(parsePort("--p", "65535"), 65535);
  EXPECT_EQ(parsePort("--p", "0", /*allow_zero=*/true), 0);
  EXPECT_NE(error([] { parsePort("--p", "0"); }).find("out of range"), std::string::npos);
  EXPECT_NE(error([] { parsePort("--p", "65536"); }).find("65536"), std::string::npos);
  auto hp = parseHostPort("--e", "node1:1234", 29400);
  EXPECT_EQ(hp.host, "node1");
  EXPECT_EQ(hp.port, 1234);
  EXPECT_EQ(parseHostPort("--e", "node1", 29400).port, 29400);
  hp = parseHostPort("--e", "[fe80::1]:99", 1);
  EXPECT_EQ(hp.host, "fe80::1");
  EXPECT_EQ(hp.port, 99);
  EXPECT_EQ(parseHostPort("--e", "::1", 7).host, "::1");
  EXPECT_EQ(parseHostPort("--e", "[::1]", 7).port, 7);
  EXPECT_NE(error([] { parseHostPort("--e", "h:", 1); }).find("ends in ':'"), std::string::npos);
  EXPECT_NE(error([] { parseHostPort("--e", ":5", 1); }).find("names no host"), std::string::npos);
  EXPECT_NE(error([] { parseHostPort("--e", "h:-1", 1); }).find("--e port"), std::string::npos);
  EXPECT_NE(error([] { parseHostPort("--e", "[::1]x", 1); }).find("after ']'"), std::string::npos);
}

TEST(Parse, ListsAndSuggestions) {
  EXPECT_EQ(splitList(" a, b ,,c ", ','), (std::vector<std::string>{"a", "b", "", "c"}));
  EXPECT_TRUE(splitList("  ", ',').empty());
  std::vector<std::string> flags = {"--nproc-per-node", "--nnodes", "--node-rank"};
  EXPECT_EQ(closestMatch("--nproc-per-nod", flags), "--nproc-per-node");
  EXPECT_EQ(closestMatch("--nnode", flags), "--nnodes");
  EXPECT_EQ(closestMatch("--colour", flags), "");
}
