// The launcher's environment contract: round trip, and clear errors for bad values.
#include "dtrain/distribute/launcher_env.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "dtrain/core/error.h"

namespace dtrain::distribute {
namespace {

using Env = std::map<std::string, std::string>;

LauncherEnv parse(const Env& env) {
  return LauncherEnv::from_lookup([&](const char* name) -> const char* {
    const auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

Env variables(const LauncherEnv& e) {
  Env env;
  for (const auto& [k, v] : e.to_variables()) env[k] = v;
  return env;
}

// The message of the InvalidArgumentError parse(env) throws, or "" if it does not throw.
std::string error_of(const Env& env) {
  try {
    parse(env);
  } catch (const InvalidArgumentError& e) {
    return e.what();
  }
  return "";
}

LauncherEnv example() {
  return {.rank = 5,
          .world_size = 6,
          .local_rank = 2,
          .local_world_size = 3,
          .node_rank = 1,
          .nnodes = 2,
          .rdzv = "node0:29500",
          .generation = 3,
          .master = HostPort{.host = "node0", .port = 29500},
          .run_id = "job7"};
}

TEST(LauncherEnvTest, RoundTripsThroughVariables) {
  const Env env = variables(example());
  EXPECT_EQ(env.at("DTRAIN_RANK"), "5");
  EXPECT_EQ(env.at("DTRAIN_WORLD_SIZE"), "6");
  EXPECT_EQ(env.at("DTRAIN_MASTER_ADDR"), "node0");
  EXPECT_EQ(env.at("DTRAIN_MASTER_PORT"), "29500");
  const LauncherEnv e = parse(env);
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world_size, 6);
  EXPECT_EQ(e.local_rank, 2);
  EXPECT_EQ(e.local_world_size, 3);
  EXPECT_EQ(e.node_rank, 1);
  EXPECT_EQ(e.nnodes, 2);
  EXPECT_EQ(e.rdzv, "node0:29500");
  EXPECT_TRUE(e.rdzv_is_coordinator());
  EXPECT_EQ(e.generation, 3);
  ASSERT_TRUE(e.master.has_value());
  EXPECT_EQ(e.master->to_string(), "node0:29500");
  EXPECT_EQ(e.run_id, "job7");
}

TEST(LauncherEnvTest, StoreUrlsAndNoService) {
  LauncherEnv in = example();
  in.rdzv = "file:///shared/rdzv";
  in.master.reset();
  const Env env = variables(in);
  EXPECT_EQ(env.count("DTRAIN_MASTER_ADDR"), 0u);
  const LauncherEnv e = parse(env);
  EXPECT_FALSE(e.rdzv_is_coordinator());
  EXPECT_FALSE(e.master.has_value());
}

TEST(LauncherEnvTest, MissingOrMalformedVariablesAreNamed) {
  Env env = variables(example());
  env.erase("DTRAIN_RANK");
  EXPECT_NE(error_of(env).find("DTRAIN_RANK is not set"), std::string::npos) << error_of(env);

  env = variables(example());
  env["DTRAIN_WORLD_SIZE"] = "six";
  EXPECT_NE(error_of(env).find("DTRAIN_WORLD_SIZE='six'"), std::string::npos) << error_of(env);

  env = variables(example());
  env["DTRAIN_RANK"] = "6";  // == world size
  EXPECT_NE(error_of(env).find("DTRAIN_RANK='6'"), std::string::npos) << error_of(env);

  env = variables(example());
  env["DTRAIN_LOCAL_RANK"] = "3";
  EXPECT_NE(error_of(env).find("DTRAIN_LOCAL_RANK='3'"), std::string::npos) << error_of(env);

  env = variables(example());
  env["DTRAIN_RDZV"] = "node0";
  EXPECT_NE(error_of(env).find("DTRAIN_RDZV 'node0'"), std::string::npos) << error_of(env);

  env = variables(example());
  env.erase("DTRAIN_MASTER_PORT");
  EXPECT_NE(error_of(env).find("set together"), std::string::npos) << error_of(env);

  env = variables(example());
  env["DTRAIN_MASTER_PORT"] = "70000";
  EXPECT_NE(error_of(env).find("DTRAIN_MASTER_PORT='70000'"), std::string::npos);
}

TEST(LauncherEnvTest, HostPortParsing) {
  EXPECT_EQ(parse_host_port("127.0.0.1:0", "x").port, 0);
  const HostPort v6 = parse_host_port("[::1]:29500", "x");
  EXPECT_EQ(v6.host, "::1");
  EXPECT_EQ(v6.to_string(), "[::1]:29500");
  EXPECT_THROW(parse_host_port("host", "x"), InvalidArgumentError);
  EXPECT_THROW(parse_host_port("host:", "x"), InvalidArgumentError);
  EXPECT_THROW(parse_host_port(":80", "x"), InvalidArgumentError);
  EXPECT_THROW(parse_host_port("::1:80", "x"), InvalidArgumentError);
  EXPECT_THROW(parse_host_port("host:65536", "x"), InvalidArgumentError);
}

}  // namespace
}  // namespace dtrain::distribute
