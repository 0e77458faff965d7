// Run configuration: every error names the file, the key and the line.
#include <rl_api.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

const std::string kData = RL_TEST_DATA_DIR;

std::vector<std::string> schema_keys() {
    rl_result_t *r = nullptr;
    EXPECT_EQ(rl_config_schema(&r), RL_OK);
    rl_string_view_t s{};
    rl_result_text(r, "schema", &s);
    std::vector<std::string> keys;
    for (const auto &k : nlohmann::json::parse(std::string(s.data, s.length)))
        keys.push_back(k["key"].get<std::string>());
    rl_result_destroy(r);
    return keys;
}

struct Loaded {
    rl_status_t status;
    std::string error;
    nlohmann::json config;
};

Loaded load(const std::string &file, const std::vector<std::string> &sets = {}) {
    std::vector<const char *> ptrs;
    for (const auto &s : sets) ptrs.push_back(s.c_str());
    rl_result_t *r = nullptr;
    const std::string path = file.empty() ? "" : kData + "/" + file;
    Loaded out{rl_config_load(path.empty() ? nullptr : path.c_str(), ptrs.data(), ptrs.size(), &r),
               "",
               {}};
    if (out.status != RL_OK) {
        out.error = rl_last_error();
        return out;
    }
    rl_string_view_t s{};
    rl_result_text(r, "config", &s);
    out.config = nlohmann::json::parse(std::string(s.data, s.length));
    rl_result_destroy(r);
    return out;
}

TEST(Config, DefaultsCoverEverySchemaKey) {
    Loaded l = load("");
    ASSERT_EQ(l.status, RL_OK) << l.error;
    const auto keys = schema_keys();
    EXPECT_GT(keys.size(), 30u);
    for (const auto &k : keys) {
        std::string ptr = "/" + k;
        for (auto &c : ptr)
            if (c == '.') c = '/';
        EXPECT_TRUE(l.config.contains(nlohmann::json::json_pointer(ptr))) << k;
    }
    EXPECT_EQ(l.config["trainer"]["lr_schedule"], "constant");
    EXPECT_EQ(l.config["model"]["path"], "");
}

TEST(Config, FileValuesOverrideDefaultsAndFreeFormParamsPassThrough) {
    Loaded l = load("good.yaml");
    ASSERT_EQ(l.status, RL_OK) << l.error;
    EXPECT_EQ(l.config["run"]["steps"], 5);
    EXPECT_DOUBLE_EQ(l.config["trainer"]["learning_rate"].get<double>(), 0.001);
    EXPECT_EQ(l.config["env"]["params"]["digits"], 2);
    EXPECT_EQ(l.config["env"]["params"]["ops"], nlohmann::json::array({"add", "sub"}));
    EXPECT_EQ(l.config["filters"][0]["name"], "gibberish");
    EXPECT_EQ(l.config["filters"][0]["enforce"], true);
    EXPECT_EQ(l.config["filters"][0]["params"], nlohmann::json::object());
    EXPECT_EQ(l.config["run"]["seed"], 0);
}

TEST(Config, MalformedYamlNamesFileAndLine) {
    Loaded l = load("malformed.yaml");
    EXPECT_EQ(l.status, RL_ERR_INVALID_ARG);
    EXPECT_NE(l.error.find("malformed.yaml:"), std::string::npos) << l.error;
    EXPECT_NE(l.error.find("malformed YAML"), std::string::npos) << l.error;
}

TEST(Config, UnknownKeyNamesFileLineKeyAndValidKeys) {
    Loaded l = load("unknown_key.yaml");
    EXPECT_EQ(l.status, RL_ERR_INVALID_ARG);
    EXPECT_NE(l.error.find("unknown_key.yaml:4:3: unknown key 'trainer.learnig_rate'"),
              std::string::npos)
        << l.error;
    EXPECT_NE(l.error.find("valid keys under 'trainer': learning_rate"), std::string::npos)
        << l.error;
}

TEST(Config, WrongTypeNamesFileLineKeyAndExpectedType) {
    Loaded l = load("wrong_type.yaml");
    EXPECT_EQ(l.status, RL_ERR_INVALID_ARG);
    EXPECT_NE(l.error.find("wrong_type.yaml:3:9: key 'run.seed' must be an integer, got 'lots'"),
              std::string::npos)
        << l.error;
}

TEST(Config, SectionGivenAScalarIsRefused) {
    Loaded l = load("section_not_mapping.yaml");
    EXPECT_NE(l.error.find("section_not_mapping.yaml:1:6: key 'run' must be a mapping"),
              std::string::npos)
        << l.error;
}

TEST(Config, FilterItemWithUnknownKeyIsRefused) {
    Loaded l = load("bad_filter_item.yaml");
    EXPECT_NE(l.error.find("unknown key 'enforec' in an item of 'filters'"), std::string::npos)
        << l.error;
}

TEST(Config, MissingFileIsAnIoErrorNamingIt) {
    Loaded l = load("nope.yaml");
    EXPECT_EQ(l.status, RL_ERR_IO);
    EXPECT_NE(l.error.find("nope.yaml' cannot be read"), std::string::npos) << l.error;
}

TEST(Config, OverridesApplyAfterTheFileAndAreChecked) {
    Loaded l = load("good.yaml", {"run.steps=7", "env.params.digits=3", "rollout.stop=[\"\\n\"]"});
    ASSERT_EQ(l.status, RL_OK) << l.error;
    EXPECT_EQ(l.config["run"]["steps"], 7);
    EXPECT_EQ(l.config["env"]["params"]["digits"], 3);
    EXPECT_EQ(l.config["rollout"]["stop"][0], "\n");
    Loaded bad = load("", {"run.stepz=3"});
    EXPECT_NE(bad.error.find("--set run.stepz=3: unknown key 'run.stepz'; valid keys under 'run'"),
              std::string::npos)
        << bad.error;
    Loaded type = load("", {"trainer.enable_packing=maybe"});
    EXPECT_NE(type.error.find("'trainer.enable_packing' must be true or false"), std::string::npos)
        << type.error;
    Loaded noeq = load("", {"run.steps"});
    EXPECT_NE(noeq.error.find("--set run.steps: expected key=value"), std::string::npos)
        << noeq.error;
    Loaded choice = load("", {"tokenizer.chat_template=jinja"});
    EXPECT_NE(choice.error.find("must be one of none,chatml,llama3; got 'jinja'"),
              std::string::npos)
        << choice.error;
}

TEST(Config, EverySchemaKeyIsDocumented) {
    std::ifstream in(std::string(RL_TEST_SOURCE_DIR) + "/docs/configuration.md");
    ASSERT_TRUE(in) << "docs/configuration.md is missing";
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string doc = ss.str();
    for (const auto &k : schema_keys())
        EXPECT_NE(doc.find("`" + k + "`"), std::string::npos)
            << "docs/configuration.md does not document `" << k << "`";
}

} // namespace
