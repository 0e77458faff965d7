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

// Loading `file` must be refused as an invalid argument with an error that
// contains every one of `needles`.
::testing::AssertionResult file_refused(const std::string &file,
                                        const std::vector<std::string> &needles) {
    const Loaded l = load(file);
    bool ok = l.status == RL_ERR_INVALID_ARG;
    for (const auto &n : needles) ok = ok && l.error.find(n) != std::string::npos;
    if (ok) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << file << ": status " << l.status << ", error: " << l.error;
}

// The override `set` alone must be refused with an error containing `needle`.
::testing::AssertionResult set_refused(const std::string &set, const std::string &needle) {
    const Loaded l = load("", {set});
    if (l.status != RL_OK && l.error.find(needle) != std::string::npos)
        return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << "--set " << set << ": status " << l.status << ", error: " << l.error;
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
    EXPECT_TRUE(file_refused("malformed.yaml", {"malformed.yaml:", "malformed YAML"}));
}

TEST(Config, UnknownKeyNamesFileLineKeyAndValidKeys) {
    EXPECT_TRUE(file_refused("unknown_key.yaml",
                             {"unknown_key.yaml:4:3: unknown key 'trainer.learnig_rate'",
                              "valid keys under 'trainer': learning_rate"}));
}

TEST(Config, WrongTypeNamesFileLineKeyAndExpectedType) {
    EXPECT_TRUE(file_refused(
        "wrong_type.yaml", {"wrong_type.yaml:3:9: key 'run.seed' must be an integer, got 'lots'"}));
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
    EXPECT_TRUE(set_refused("run.stepz=3",
                            "--set run.stepz=3: unknown key 'run.stepz'; valid keys under 'run'"));
    EXPECT_TRUE(set_refused("trainer.enable_packing=maybe",
                            "'trainer.enable_packing' must be true or false"));
    EXPECT_TRUE(set_refused("run.steps", "--set run.steps: expected key=value"));
    EXPECT_TRUE(set_refused("tokenizer.chat_template=jinja",
                            "must be one of none,model,chatml,llama3; got 'jinja'"));
}

std::string text_of(rl_result_t *r, const char *name) {
    rl_string_view_t s{};
    EXPECT_EQ(rl_result_text(r, name, &s), RL_OK) << name;
    return std::string(s.data, s.length);
}

// docs/configuration.md's key tables are `rlhost config --markdown`: a key,
// default, range or meaning changed in a declaration fails here until the doc
// is regenerated.
TEST(Config, DocumentationTablesAreGeneratedFromTheSchema) {
    std::ifstream in(std::string(RL_TEST_SOURCE_DIR) + "/docs/configuration.md");
    ASSERT_TRUE(in) << "docs/configuration.md is missing";
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string doc = ss.str();
    const std::string begin = "<!-- BEGIN GENERATED: rlhost config --markdown -->\n";
    const std::string end = "<!-- END GENERATED -->";
    const size_t a = doc.find(begin), b = doc.find(end);
    ASSERT_NE(a, std::string::npos) << "docs/configuration.md lacks the generated-tables marker";
    ASSERT_NE(b, std::string::npos);
    rl_result_t *r = nullptr;
    ASSERT_EQ(rl_config_schema(&r), RL_OK);
    const std::string tables = text_of(r, "markdown");
    rl_result_destroy(r);
    EXPECT_EQ(doc.substr(a + begin.size(), b - a - begin.size()), tables)
        << "regenerate with: build/bin/rlhost config --markdown";
    for (const auto &k : schema_keys()) EXPECT_NE(tables.find("`" + k + "`"), std::string::npos);
}

TEST(Config, OutOfRangeValuesAreRefusedAtLoadNamingFileLineAndRange) {
    Loaded l = load("out_of_range.yaml");
    EXPECT_EQ(l.status, RL_ERR_INVALID_ARG);
    EXPECT_NE(l.error.find("out_of_range.yaml:4:18: key 'trainer.learning_rate' must be >= 0, got "
                           "-1"),
              std::string::npos)
        << l.error;
    EXPECT_TRUE(
        set_refused("rollout.temperature=-0.5",
                    "--set rollout.temperature=-0.5: key 'rollout.temperature' must be >= 0"));
    EXPECT_TRUE(
        set_refused("engine.kv_cache_fraction=0", "'engine.kv_cache_fraction' must be in (0, 1]"));
    EXPECT_TRUE(
        set_refused("model.device=cuda:x", "must be one of auto,cpu,cuda,cuda:N; got 'cuda:x'"));
    EXPECT_EQ(load("", {"model.device=cuda:1"}).status, RL_OK);
}

TEST(Config, NullableKeysAcceptNullAndDefaultsAgreeWithTheCore) {
    Loaded l = load("", {"buffer.max_off_policy_steps=null", "buffer.easy_threshold=0.9"});
    ASSERT_EQ(l.status, RL_OK) << l.error;
    EXPECT_TRUE(l.config["buffer"]["max_off_policy_steps"].is_null());
    EXPECT_EQ(l.config["buffer"]["easy_threshold"], 0.9);
    Loaded d = load("");
    EXPECT_EQ(d.config["buffer"]["max_off_policy_steps"], 8); // as rl_buffer_create's default
    EXPECT_TRUE(d.config["buffer"]["hard_threshold"].is_null());
    EXPECT_TRUE(set_refused("run.steps=null", "'run.steps' must be an integer, got"));
}

struct Declared {
    rl_status_t status;
    std::string error;
    nlohmann::json config;
};

Declared declare(const nlohmann::json &config, const std::string &decl) {
    rl_result_t *r = nullptr;
    const std::string text = config.dump();
    Declared d{rl_config_declare(text.c_str(), decl.c_str(), &r), "", {}};
    if (d.status == RL_OK) {
        d.config = nlohmann::json::parse(text_of(r, "config"));
        rl_result_destroy(r);
    } else {
        d.error = rl_last_error();
    }
    return d;
}

const char *kPpoKeys = R"([
  {"key": "ppo.epochs", "type": "integer", "default": 2, "doc": "passes", "min": 1},
  {"key": "ppo.minibatches", "type": "integer", "default": 1, "doc": "splits", "min": 1}])";

TEST(Config, ScriptSectionsAreKeptUntilTheScriptDeclaresThem) {
    rl_result_t *r = nullptr;
    const std::string path = kData + "/script_section.yaml";
    ASSERT_EQ(rl_config_load(path.c_str(), nullptr, 0, &r), RL_OK) << rl_last_error();
    const nlohmann::json config = nlohmann::json::parse(text_of(r, "config"));
    EXPECT_EQ(nlohmann::json::parse(text_of(r, "undeclared")), nlohmann::json({"ppo"}));
    rl_result_destroy(r);
    EXPECT_EQ(config["ppo"]["epochs"], 4);

    Declared d = declare(config, kPpoKeys);
    ASSERT_EQ(d.status, RL_OK) << d.error;
    EXPECT_EQ(d.config["ppo"]["epochs"], 4);
    EXPECT_EQ(d.config["ppo"]["minibatches"], 1); // the declared default
    EXPECT_EQ(d.config["run"]["steps"], 3);

    Declared none = declare(config, "[]");
    EXPECT_EQ(none.status, RL_ERR_INVALID_ARG);
    EXPECT_NE(none.error.find("unknown key 'ppo'"), std::string::npos) << none.error;
}

TEST(Config, DeclaredKeysAreCheckedLikeTheHostsOwn) {
    Loaded l = load("", {"ppo.epochs=0"});
    ASSERT_EQ(l.status, RL_OK) << l.error;
    Declared range = declare(l.config, kPpoKeys);
    EXPECT_NE(range.error.find("key 'ppo.epochs' must be >= 1, got 0"), std::string::npos)
        << range.error;
    Loaded typo = load("", {"ppo.epocs=3"});
    Declared unknown = declare(typo.config, kPpoKeys);
    EXPECT_NE(unknown.error.find("unknown key 'ppo.epocs'; valid keys under 'ppo': epochs, "
                                 "minibatches"),
              std::string::npos)
        << unknown.error;
    Declared host =
        declare(l.config, R"([{"key": "trainer.foo", "type": "integer", "default": 1}])");
    EXPECT_NE(host.error.find("is in the host's section 'trainer'"), std::string::npos)
        << host.error;
    Declared bad_default =
        declare(l.config, R"([{"key": "ppo.epochs", "type": "integer", "default": "two"}])");
    EXPECT_NE(bad_default.error.find("default: key 'ppo.epochs' must be an integer"),
              std::string::npos)
        << bad_default.error;
    Declared bad_type = declare(l.config, R"([{"key": "ppo.epochs", "type": "int"}])");
    EXPECT_NE(bad_type.error.find("type 'int' is unknown"), std::string::npos) << bad_type.error;
}

TEST(Config, AHostKeyTypoStaysAnErrorAtLoad) {
    Loaded l = load("", {"trainr.learning_rate=1"});
    // 'trainr' is not a host section, so it is kept for the script; declaring
    // nothing for it makes it an error naming it.
    ASSERT_EQ(l.status, RL_OK) << l.error;
    Declared d = declare(l.config, "[]");
    EXPECT_NE(d.error.find("unknown key 'trainr'"), std::string::npos) << d.error;
    EXPECT_TRUE(set_refused("trainr=1", "unknown key 'trainr'; valid keys at the top level"));
}

} // namespace
