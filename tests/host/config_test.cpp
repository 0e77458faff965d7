// Run configuration: every error names the file, the key and the line.
#include <rl_api.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cstdio>
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

Loaded load_path(const std::string &path, const std::vector<std::string> &sets = {}) {
    std::vector<const char *> ptrs;
    for (const auto &s : sets) ptrs.push_back(s.c_str());
    rl_result_t *r = nullptr;
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

Loaded load(const std::string &file, const std::vector<std::string> &sets = {}) {
    return load_path(file.empty() ? "" : kData + "/" + file, sets);
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

// `text` written to a file named `name` in the test's temporary folder (so
// that errors name it); removed when the test's load is done.
struct YamlFile {
    std::string path;
    YamlFile(const std::string &name, const std::string &text)
        : path(::testing::TempDir() + std::to_string(getpid()) + "_" + name) {
        std::ofstream(path, std::ios::binary) << text;
    }
    ~YamlFile() { std::remove(path.c_str()); }
    YamlFile(const YamlFile &) = delete;
    YamlFile &operator=(const YamlFile &) = delete;
};

// Loading `text` (as file `name`) must be refused as an invalid argument with
// an error that contains every one of `needles`.
::testing::AssertionResult text_refused(const std::string &name, const std::string &text,
                                        const std::vector<std::string> &needles) {
    const YamlFile f(name, text);
    rl_result_t *r = nullptr;
    const rl_status_t st = rl_config_load(f.path.c_str(), nullptr, 0, &r);
    if (st == RL_OK) {
        rl_result_destroy(r);
        return ::testing::AssertionFailure() << name << " was loaded";
    }
    const std::string error = rl_last_error();
    bool ok = st == RL_ERR_INVALID_ARG;
    for (const auto &n : needles) ok = ok && error.find(n) != std::string::npos;
    if (ok) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << name << ": status " << st << ", error: " << error;
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
    // QeRL noise (docs/moe.md): nested keys of the engine section.
    EXPECT_TRUE(set_refused("engine.noise_scheduler.sigma_start=0",
                            "'engine.noise_scheduler.sigma_start' must be > 0"));
    EXPECT_TRUE(set_refused("engine.noise_scheduler.num_stages=1",
                            "'engine.noise_scheduler.num_stages' must be >= 2"));
    EXPECT_TRUE(set_refused("engine.noise_scheduler.sigma=0.1",
                            "unknown key 'engine.noise_scheduler.sigma'"));
    Loaded noise = load("", {"engine.noise_scheduler.enabled=true"});
    ASSERT_EQ(noise.status, RL_OK) << noise.error;
    EXPECT_EQ(noise.config["engine"]["noise_scheduler"]["enabled"], true);
    EXPECT_EQ(noise.config["engine"]["noise_scheduler"]["num_stages"], 10);
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

// yaml-cpp gives an alias the node of its anchor, so an alias inside its own
// anchor is a cyclic graph; converting it walked forever (stack overflow).
TEST(Config, AnAliasInsideItsOwnAnchorIsRefusedNamingFileLineAndKey) {
    EXPECT_TRUE(text_refused("cycle.yaml", "sft: &a {x: *a}",
                             {"cycle.yaml:1:10: key 'sft.x' is an alias of the mapping at line 1, "
                              "column 6, which contains it"}));
    EXPECT_TRUE(
        text_refused("cycle_params.yaml", "env:\n  params: &p\n    deeper: [1, *p]\n",
                     {"cycle_params.yaml:", "key 'env.params.deeper[1]'", "which contains it"}));
    EXPECT_TRUE(text_refused("cycle_list.yaml", "filters: [{name: f, params: {l: &l [*l]}}]",
                             {"cycle_list.yaml:1:", "key 'filters[0].params.l[0]' is an alias of "
                                                    "the list"}));
    EXPECT_TRUE(set_refused("sft.x=&a {x: *a}", "--set sft.x=&a {x: *a} (at 1:5 of the value): key "
                                                "'sft.x.x' is an alias of the mapping"));
    EXPECT_TRUE(
        set_refused("env.params=&a {x: [*a]}", "key 'env.params.x[0]' is an alias of the mapping"));
    // The same anchor used twice side by side is no cycle.
    Loaded l = load("", {"ppo.shared=[&s {a: 1}, *s]"});
    ASSERT_EQ(l.status, RL_OK) << l.error;
    EXPECT_EQ(l.config["ppo"]["shared"][1]["a"], 1);
}

// A '<<' merge key whose alias leads back to a mapping around it.
TEST(Config, AMergeKeyThatLeadsBackIsRefused) {
    EXPECT_TRUE(text_refused("merge.yaml",
                             "env:\n  params: &base\n    inner:\n      <<: *base\n      x: 1\n",
                             {"merge.yaml:4:7: key 'env.params.inner.<<' is an alias of the "
                              "mapping at line 2, column 11"}));
    EXPECT_TRUE(
        text_refused("merge_chain.yaml", "ppo:\n  a: &a\n    b: &b\n      c:\n        <<: [*b]\n",
                     {"merge_chain.yaml:5:13: key 'ppo.a.b.c.<<[0]'", "which contains it"}));
    EXPECT_TRUE(set_refused("ppo.m=&m {k: {<<: *m}}", "key 'ppo.m.k.<<' is an alias"));
}

// YAML merge keys: `<<: *base` (or a list of them) adds the keys the mapping
// does not set itself, in known sections and in free-form ones alike.
TEST(Config, MergeKeysAddTheMergedKeysTheMappingDoesNotSet) {
    const YamlFile f("merge_ok.yaml", "base: &base\n"
                                      "  learning_rate: 3.0e-5\n"
                                      "  gradient_clip: 0.5\n"
                                      "other: &other\n"
                                      "  gradient_clip: 9.0\n"
                                      "  warmup_steps: 7\n"
                                      "trainer:\n"
                                      "  <<: [*base, *other]\n"
                                      "  gradient_clip: 1.0\n"
                                      "ppo:\n"
                                      "  <<: *other\n"
                                      "  own: 2\n");
    const Loaded l = load_path(f.path);
    ASSERT_EQ(l.status, RL_OK) << l.error;
    EXPECT_EQ(l.config["trainer"]["learning_rate"], 3.0e-5); // from base
    EXPECT_EQ(l.config["trainer"]["gradient_clip"], 1.0);    // its own wins
    EXPECT_EQ(l.config["trainer"]["warmup_steps"], 7);       // from the second source
    EXPECT_EQ(l.config["ppo"]["gradient_clip"], 9.0);
    EXPECT_EQ(l.config["ppo"]["own"], 2);
    EXPECT_FALSE(l.config["ppo"].contains("<<"));
    EXPECT_TRUE(text_refused("merge_scalar.yaml", "trainer:\n  <<: 3\n",
                             {"merge_scalar.yaml:2:3: key 'trainer.<<' (a YAML merge) must be a "
                              "mapping or a list of mappings, got"}));
    // A merged key is checked like a written one.
    EXPECT_TRUE(text_refused("merge_unknown.yaml", "b: &b {nope: 1}\ntrainer:\n  <<: *b\n",
                             {"unknown key 'trainer.nope'"}));
}

// Ten levels of ten aliases each stand for 10^10 values in 300 bytes: the
// conversion stops at kMaxConfigNodes instead of exhausting memory.
TEST(Config, AliasExpansionIsBoundedByANodeLimit) {
    std::string laughs = "ppo:\n  l0: &l0 [x, x, x, x, x, x, x, x, x, x]\n";
    for (int i = 1; i < 10; ++i) {
        laughs += "  l" + std::to_string(i) + ": &l" + std::to_string(i) + " [";
        for (int k = 0; k < 10; ++k) laughs += (k ? ", *l" : "*l") + std::to_string(i - 1);
        laughs += "]\n";
    }
    EXPECT_TRUE(
        text_refused("laughs.yaml", laughs,
                     {"laughs.yaml:", "key 'ppo.l4[", "expands to more than 100000 values"}));
    // Four levels (10^4 values) is a large but legal configuration.
    std::string small = laughs.substr(0, laughs.find("  l4:"));
    const YamlFile f("small_laughs.yaml", small);
    rl_result_t *r = nullptr;
    ASSERT_EQ(rl_config_load(f.path.c_str(), nullptr, 0, &r), RL_OK) << rl_last_error();
    const auto config = nlohmann::json::parse(text_of(r, "config"));
    rl_result_destroy(r);
    EXPECT_EQ(config["ppo"]["l3"][9][9][9][9], "x");
}

TEST(Config, NestingIsBoundedNamingTheKeyPath) {
    auto nested = [](int lists) {
        return "ppo:\n  x: " + std::string(lists, '[') + std::string(lists, ']') + "\n";
    };
    // 'ppo.x' is a list holding 126 more: the innermost is at 128 levels, the limit.
    Loaded ok = load("", {"ppo.x=" + std::string(127, '[') + std::string(127, ']')});
    EXPECT_EQ(ok.status, RL_OK) << ok.error;
    const YamlFile f("deep_ok.yaml", nested(127));
    rl_result_t *r = nullptr;
    ASSERT_EQ(rl_config_load(f.path.c_str(), nullptr, 0, &r), RL_OK) << rl_last_error();
    rl_result_destroy(r);
    EXPECT_TRUE(text_refused("deep.yaml", nested(128),
                             {"deep.yaml:2:", "key 'ppo.x[0][0]", "is nested deeper than 128"}));
    EXPECT_TRUE(text_refused("deeper.yaml", nested(5000),
                             {"deeper.yaml:", "nested too deeply for the YAML parser"}));
    std::string key = "ppo";
    for (int i = 0; i < 200; ++i) key += ".k";
    EXPECT_TRUE(set_refused(key + "=1", "the key has 201 parts; at most 128"));
}

TEST(Config, NumbersOutsideTheirRangeAreRefusedNamingTheKey) {
    EXPECT_TRUE(text_refused("huge_int.yaml", "run:\n  seed: 99999999999999999999\n",
                             {"huge_int.yaml:2:9: key 'run.seed' must be an integer, got "
                              "'99999999999999999999', outside the 64-bit range"}));
    EXPECT_TRUE(set_refused("run.seed=0x1ffffffffffffffff", "outside the 64-bit range"));
    EXPECT_TRUE(text_refused("huge_float.yaml", "trainer:\n  learning_rate: 1e400\n",
                             {"huge_float.yaml:2:18: key 'trainer.learning_rate' must be a "
                              "number, got '1e400', outside the range of a double"}));
    EXPECT_TRUE(set_refused("trainer.learning_rate=.inf",
                            "key 'trainer.learning_rate' must be a finite number, got '.inf'"));
    // Free-form values were passed on as the string "1e400", or as null for
    // .nan (JSON has neither).
    EXPECT_TRUE(text_refused("params_float.yaml", "env:\n  params:\n    scale: 1e400\n",
                             {"params_float.yaml:3:5: key 'env.params.scale' is the number "
                              "'1e400', outside the range of a double"}));
    EXPECT_TRUE(set_refused("env.params.x=.nan", "key 'env.params.x' is '.nan': JSON has no"));
    EXPECT_TRUE(set_refused("ppo.seed=18446744073709551616",
                            "key 'ppo.seed' is the integer '18446744073709551616', outside"));
    // Small magnitudes and quoted numbers are fine.
    Loaded l = load("", {"env.params.tiny=1e-400", "env.params.big='1e400'",
                         "env.params.i=-9223372036854775808"});
    ASSERT_EQ(l.status, RL_OK) << l.error;
    EXPECT_EQ(l.config["env"]["params"]["tiny"], 0.0);
    EXPECT_EQ(l.config["env"]["params"]["big"], "1e400");
    EXPECT_EQ(l.config["env"]["params"]["i"], INT64_MIN);
}

// Ill-formed UTF-8 reached nlohmann's dump(), whose type_error came out as
// RL_ERR_INTERNAL naming nothing.
TEST(Config, IllFormedUtf8IsRefusedNamingTheKey) {
    EXPECT_TRUE(text_refused("utf8_key.yaml", "env:\n  params:\n    \"b\xC3\": 1\n",
                             {"utf8_key.yaml:3:5: a key under 'env.params' is not valid UTF-8 "
                              "(byte 1 of 'b\\xC3')"}));
    EXPECT_TRUE(text_refused("utf8_value.yaml", "run:\n  name: \"ok\xFF\"\n",
                             {"utf8_value.yaml:2:9: key 'run.name' is not valid UTF-8 (byte 2"}));
    EXPECT_TRUE(text_refused("utf8_list.yaml", "ppo:\n  words: [fine, \"x\xED\xA0\x80\"]\n",
                             {"key 'ppo.words[1]' is not valid UTF-8 (byte 1"}));
    EXPECT_TRUE(set_refused("run.name=caf\xC3", "--set run.name=caf\\xC3: is not valid UTF-8"));
    EXPECT_TRUE(set_refused("ppo.\xFF=1", "is not valid UTF-8 (byte 4)"));
    Loaded l = load("", {"run.name=caf\xC3\xA9 \xF0\x9F\x98\x80"});
    ASSERT_EQ(l.status, RL_OK) << l.error;
    EXPECT_EQ(l.config["run"]["name"], "caf\xC3\xA9 \xF0\x9F\x98\x80");
}

// A list or mapping as a key made yaml-cpp's as<std::string>() throw
// (RL_ERR_INTERNAL).
TEST(Config, KeysThatAreNotNamesAreRefused) {
    EXPECT_TRUE(text_refused("list_key.yaml", "env:\n  params:\n    ? [1, 2]\n    : 3\n",
                             {"list_key.yaml:3:7: keys must be plain names; a key under "
                              "'env.params' is a list"}));
    EXPECT_TRUE(set_refused("loss.params={{a: 1}: 2}", "a key under 'loss.params' is a mapping"));
}

// rl_config_declare copies the configuration it is given; a JSON value nested
// a million deep overflowed the stack in that copy.
TEST(Config, DeclareRefusesConfigurationsNestedTooDeeply) {
    // (Built as text: nlohmann's own dump() would recurse as deep.)
    const std::string deep =
        R"({"ppo": {"x": )" + std::string(1000000, '[') + std::string(1000000, ']') + "}}";
    rl_result_t *r = nullptr;
    ASSERT_EQ(rl_config_declare(deep.c_str(), kPpoKeys, &r), RL_ERR_INVALID_ARG);
    const std::string error = rl_last_error();
    EXPECT_NE(error.find("rl_config_declare: config_json: JSON nested deeper than 128 levels"),
              std::string::npos)
        << error.substr(0, 200);
    const std::string decl = R"([{"key": "ppo.epochs", "type": "mapping", "default": {"a": )" +
                             std::string(1000000, '[') + std::string(1000000, ']') + "}}]";
    ASSERT_EQ(rl_config_declare(R"({"ppo": {}})", decl.c_str(), &r), RL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(rl_last_error())
                  .find("rl_config_declare: declarations_json: JSON nested deeper than 128"),
              std::string::npos)
        << std::string(rl_last_error()).substr(0, 200);
}

// Declaration fields of the wrong type came out of nlohmann's value() as a
// type_error (RL_ERR_INTERNAL).
TEST(Config, DeclarationFieldsOfTheWrongTypeAreRefusedNamingThem) {
    const nlohmann::json config = load("").config;
    Declared doc = declare(config, R"([{"key": "ppo.epochs", "type": "integer", "default": 1,
                                        "doc": 5}])");
    EXPECT_EQ(doc.status, RL_ERR_INVALID_ARG);
    EXPECT_NE(doc.error.find("config declarations item 1: 'doc' must be a string, got number"),
              std::string::npos)
        << doc.error;
    Declared nullable = declare(config, R"([{"key": "ppo.epochs", "type": "integer",
                                             "default": 1, "nullable": "yes"}])");
    EXPECT_EQ(nullable.status, RL_ERR_INVALID_ARG);
    EXPECT_NE(nullable.error.find("'nullable' must be true or false, got string"),
              std::string::npos)
        << nullable.error;
    Declared open = declare(config, R"([{"key": "ppo.epochs", "type": "integer", "default": 1,
                                         "min": 0, "min_open": 1}])");
    EXPECT_NE(open.error.find("'min_open' must be true or false, got number"), std::string::npos)
        << open.error;
}

} // namespace
