// tests/envs: the env plugins through librl.
#include "runtime_fixture.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace {

using json = nlohmann::json;
using rltest::Result;

rl_string_view_t sv(const std::string &s) {
    return rl_string_view_t{s.data(), s.size()};
}

TEST(EnvRuntime, ReverseTextSampleAndScoreRoundTrip) {
    rltest::RuntimeFixture rt({"env-reverse_text"});
    ASSERT_EQ(rt.status(), RL_OK) << rl_last_error();
    rl_instance_t *env = nullptr;
    ASSERT_EQ(rl_instance_create(rt.get(), "env", "reverse_text", R"({"max_len": 5})", &env), RL_OK)
        << rl_last_error();
    Result s;
    ASSERT_EQ(rl_env_sample(env, 4, 7, &s.r), RL_OK) << rl_last_error();
    const json tasks = json::parse(s.text("tasks"));
    ASSERT_EQ(tasks.size(), 4u);
    for (const json &t : tasks) {
        Result sc;
        const std::string task = t.dump(), answer = t["answer"];
        ASSERT_EQ(rl_env_score(env, sv(task), sv(answer), &sc.r), RL_OK) << rl_last_error();
        EXPECT_EQ(sc.scalar("reward"), 1.0);
        EXPECT_EQ(sc.metric("exact_match"), 1.0);
    }
    rl_instance_destroy(env);
}

TEST(EnvRuntime, ACountPastOneCallsLimitIsRefusedNamingIt) {
    // UINT64_MAX is what -1 becomes through the unsigned parameter (Python's
    // env.sample(-1) did that): the env built tasks until the process was killed.
    rltest::RuntimeFixture rt({"env-reverse_text"});
    ASSERT_EQ(rt.status(), RL_OK) << rl_last_error();
    rl_instance_t *env = nullptr;
    ASSERT_EQ(rl_instance_create(rt.get(), "env", "reverse_text", "{}", &env), RL_OK)
        << rl_last_error();
    for (const uint64_t n : {UINT64_MAX, (uint64_t{1} << 20) + 1}) {
        Result s;
        EXPECT_EQ(rl_env_sample(env, n, 7, &s.r), RL_ERR_INVALID_ARG);
        EXPECT_NE(std::string(rl_last_error())
                      .find("rl_env_sample: n " + std::to_string(n) +
                            " is more than 1048576 tasks in one call"),
                  std::string::npos)
            << rl_last_error();
    }
    Result ok;
    EXPECT_EQ(rl_env_sample(env, 2, 7, &ok.r), RL_OK) << rl_last_error();
    rl_instance_destroy(env);
}

TEST(EnvRuntime, CommandEnvTimeoutReachesTheEmbedderAsAnError) {
    rltest::RuntimeFixture rt({"env-command"});
    ASSERT_EQ(rt.status(), RL_OK) << rl_last_error();
    const json params = {
        {"command",
         {"python3", std::string(RL_TEST_SOURCE_DIR) + "/tests/envs/verifiers/flaky.py"}},
        {"timeout_s", 1.0}};
    rl_instance_t *env = nullptr;
    ASSERT_EQ(rl_instance_create(rt.get(), "env", "command", params.dump().c_str(), &env), RL_OK)
        << rl_last_error();
    const std::string task = R"({"prompt": "p", "answer": "a", "metadata": {}})";
    rl_result_t *r = nullptr;
    EXPECT_EQ(rl_env_score(env, sv(task), sv("hang"), &r), RL_ERR_TIMEOUT);
    EXPECT_NE(std::string(rl_last_error()).find("did not answer in time"), std::string::npos)
        << rl_last_error();
    Result ok;
    ASSERT_EQ(rl_env_score(env, sv(task), sv("fine"), &ok.r), RL_OK) << rl_last_error();
    EXPECT_EQ(ok.scalar("reward"), 1.0);
    rl_instance_destroy(env);
}

} // namespace
