// Declared settings (rl/core/params.hpp): the one reader, and the rule that a
// setting's default is the same in its declaration and in its C++ struct.
#include "rl/core/buffer.hpp"
#include "rl/core/engine.hpp"
#include "rl/core/error.hpp"
#include "rl/core/params.hpp"
#include "rl/core/trainer_config.hpp"

#include <gtest/gtest.h>

#include <string>

namespace {

using nlohmann::json;
using rl::core::ParamSpec;

std::string error_of(const std::function<void()> &f) {
    try {
        f();
    } catch (const rl::core::Error &e) {
        return e.what();
    }
    return "(no error)";
}

TEST(Params, StructDefaultsEqualTheDeclaredDefaults) {
    EXPECT_EQ(json::parse(rl::core::TrainerConfig{}.to_json()),
              json::parse(rl::core::TrainerConfig::from_json("{}").to_json()));
    const auto e = rl::core::EngineConfig{}, e0 = rl::core::EngineConfig::from_json("{}");
    EXPECT_EQ(e.max_batch_sequences, e0.max_batch_sequences);
    EXPECT_EQ(e.kv_cache_fraction, e0.kv_cache_fraction);
    EXPECT_EQ(e.noise.enabled, e0.noise.enabled);
    EXPECT_EQ(e.noise.sigma_start, e0.noise.sigma_start);
    EXPECT_EQ(e.noise.sigma_end, e0.noise.sigma_end);
    EXPECT_EQ(e.noise.num_stages, e0.noise.num_stages);
    EXPECT_EQ(e.total_steps, e0.total_steps);
    EXPECT_EQ(e.first_step, e0.first_step);
    EXPECT_EQ(e.seed, e0.seed);
    const auto b = rl::core::BufferConfig{}, b0 = rl::core::BufferConfig::from_json("{}");
    EXPECT_EQ(b.group_size, b0.group_size);
    EXPECT_EQ(b.easy_threshold, b0.easy_threshold);
    EXPECT_EQ(b.hard_threshold, b0.hard_threshold);
    EXPECT_EQ(b.drop_zero_variance, b0.drop_zero_variance);
    EXPECT_EQ(b.reward_tolerance, b0.reward_tolerance);
    EXPECT_EQ(b.min_group_size, b0.min_group_size);
    EXPECT_EQ(b.max_off_policy_steps, b0.max_off_policy_steps);
    EXPECT_EQ(b.drop_log_capacity, b0.drop_log_capacity);
}

TEST(Params, EveryDeclarationHasAValidDefaultAndAMeaning) {
    for (const auto *list :
         {&rl::core::trainer_params(), &rl::core::engine_params(), &rl::core::buffer_params()})
        for (const ParamSpec &s : *list) {
            EXPECT_FALSE(s.doc.empty()) << s.key;
            EXPECT_NO_THROW(rl::core::check_param(s, s.fallback, s.key)) << s.key;
        }
}

TEST(Params, TheReaderNamesTheKeyAndTheRule) {
    const auto &specs = rl::core::trainer_params();
    EXPECT_NE(error_of([&] {
                  rl::core::read_params(json{{"beta1", 1.0}}, specs, "trainer", "trainer config");
              }).find("trainer config: key 'trainer.beta1' must be in [0, 1), got 1.0"),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                  rl::core::read_params(json{{"warmup_steps", 2.5}}, specs, "trainer", "t");
              }).find("key 'trainer.warmup_steps' must be an integer, got 2.5"),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                  rl::core::read_params(json{{"lr", 1}}, specs, "trainer", "t");
              }).find("unknown key 'trainer.lr'; valid: learning_rate, beta1"),
              std::string::npos);
    const json filled = rl::core::read_params(json{{"warmup_steps", 3.0}}, specs, "trainer", "t");
    EXPECT_EQ(filled["warmup_steps"], 3); // integral numbers are integers
    EXPECT_EQ(filled["learning_rate"], 1e-5);
    EXPECT_TRUE(filled["seed"].is_null());
}

TEST(Params, DottedKeysAreReadNestedOrFlat) {
    const auto &specs = rl::core::engine_params();
    const json nested = rl::core::read_params(
        json{{"noise_scheduler", {{"enabled", true}, {"num_stages", 4.0}}}}, specs, "engine", "e");
    EXPECT_EQ(nested["noise_scheduler.enabled"], true);
    EXPECT_EQ(nested["noise_scheduler.num_stages"], 4);
    EXPECT_EQ(nested["noise_scheduler.sigma_start"], 5e-2); // the default
    const json flat =
        rl::core::read_params(json{{"noise_scheduler.enabled", true}}, specs, "engine", "e");
    EXPECT_EQ(flat["noise_scheduler.enabled"], true);
    EXPECT_NE(error_of([&] {
                  rl::core::read_params(json{{"noise_scheduler", {{"sigma_end", 0}}}}, specs,
                                        "engine", "engine config");
              }).find("engine config: key 'engine.noise_scheduler.sigma_end' must be > 0, got 0"),
              std::string::npos);
    EXPECT_NE(
        error_of([&] {
            rl::core::read_params(json{{"noise_scheduler", {{"x", 1}}}}, specs, "engine", "e");
        }).find("unknown key 'engine.noise_scheduler.x'"),
        std::string::npos);
    EXPECT_NE(error_of([&] {
                  rl::core::read_params(json{{"noise_scheduler", true}}, specs, "engine", "e");
              }).find("key 'engine.noise_scheduler' must be an object"),
              std::string::npos);
}

TEST(Params, ChoicesAcceptNumberedPatterns) {
    ParamSpec s;
    s.key = "device";
    s.choices = {"cpu", "cuda:N"};
    EXPECT_TRUE(rl::core::choice_allowed(s, "cuda:0"));
    EXPECT_TRUE(rl::core::choice_allowed(s, "cuda:12"));
    EXPECT_FALSE(rl::core::choice_allowed(s, "cuda:"));
    EXPECT_FALSE(rl::core::choice_allowed(s, "cuda:1x"));
    EXPECT_FALSE(rl::core::choice_allowed(s, "cud"));
}

TEST(Params, TrainerStructValidationUsesTheDeclarations) {
    rl::core::TrainerConfig c;
    c.learning_rate = -1;
    EXPECT_NE(error_of([&] { c.validate(); }).find("'trainer.learning_rate' must be >= 0"),
              std::string::npos);
}

} // namespace

namespace {

TEST(TrainerConfig, LogprobTemperatureFollowsTheBatchAndRefusesAMismatch) {
    using rl::core::logprob_temperature_for;
    rl::core::TrainerConfig c; // logprob_temperature unset
    bool greedy = true;
    EXPECT_EQ(logprob_temperature_for(c, std::nullopt, &greedy), 1.0);
    EXPECT_FALSE(greedy);
    EXPECT_EQ(logprob_temperature_for(c, 0.7, &greedy), 0.7);
    EXPECT_EQ(logprob_temperature_for(c, 0.0, &greedy), 1.0); // greedy: no tempered distribution
    EXPECT_TRUE(greedy);

    c.logprob_temperature = 0.7;
    EXPECT_EQ(logprob_temperature_for(c, std::nullopt, &greedy), 0.7);
    EXPECT_EQ(logprob_temperature_for(c, 0.7, &greedy), 0.7);
    EXPECT_EQ(logprob_temperature_for(c, 0.0, &greedy), 0.7);
    const std::string why = error_of([&] { logprob_temperature_for(c, 1.0); });
    EXPECT_NE(why.find("trainer.logprob_temperature is 0.7"), std::string::npos) << why;
    EXPECT_NE(why.find("sampled at temperature 1.0"), std::string::npos) << why;
    EXPECT_NE(error_of([&] { logprob_temperature_for(c, -1.0); }).find(">= 0"), std::string::npos);

    const auto parsed = rl::core::TrainerConfig::from_json(R"({"logprob_temperature": 0.5})");
    ASSERT_TRUE(parsed.logprob_temperature.has_value());
    EXPECT_EQ(*parsed.logprob_temperature, 0.5);
    EXPECT_EQ(rl::core::TrainerConfig::from_json(parsed.to_json()).logprob_temperature, 0.5);
    EXPECT_FALSE(rl::core::TrainerConfig::from_json("{}").logprob_temperature.has_value());
    EXPECT_NE(error_of([] {
                  rl::core::TrainerConfig::from_json(R"({"logprob_temperature": 0})");
              }).find("trainer.logprob_temperature"),
              std::string::npos);
}

} // namespace
