// The plugin host against real fixture libraries, through the C API only.
#include <rl_api.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>
#include <thread>
#include <vector>

namespace {

const std::string kFixtures = RL_TEST_FIXTURE_DIR;

std::string fixture(const std::string &name) {
    return kFixtures + "/" + name + ".so";
}

struct Runtime {
    rl_runtime_t *rt = nullptr;
    explicit Runtime(const std::string &path) {
        rl_runtime_desc_t desc = RL_RUNTIME_DESC_INIT;
        desc.flags = RL_RUNTIME_NO_DEFAULT_PLUGINS;
        desc.plugin_path = path.c_str();
        desc.log_level = "off";
        EXPECT_EQ(rl_runtime_create(&desc, &rt), RL_OK) << rl_last_error();
    }
    ~Runtime() { rl_runtime_destroy(rt); }
    nlohmann::json list() const {
        rl_result_t *r = nullptr;
        EXPECT_EQ(rl_runtime_list_plugins(rt, &r), RL_OK);
        rl_string_view_t s{};
        EXPECT_EQ(rl_result_text(r, "plugins", &s), RL_OK);
        auto j = nlohmann::json::parse(std::string(s.data, s.length));
        rl_result_destroy(r);
        return j;
    }
    std::string refusal_for(const std::string &file) const {
        const nlohmann::json j = list();
        for (const auto &r : j["refused"])
            if (r["path"].get<std::string>().find(file) != std::string::npos)
                return r["reason"].get<std::string>();
        return "";
    }
};

// Three float64 tokens in one sequence.
struct LossBatch {
    std::vector<double> lp{-1.0, -2.0, -0.5}, adv{1.0, -1.0, 2.0};
    int64_t n = 3, cu[2] = {0, 3}, cu_shape = 2;
    std::vector<rl_tensor_arg_t> args;
    rl_loss_inputs_t in{};
    static rl_tensor_view_t view(void *data, int64_t *shape, rl_dtype_t dtype) {
        rl_tensor_view_t v{};
        v.data = data;
        v.device = {RL_DEVICE_CPU, 0};
        v.ndim = 1;
        v.dtype = dtype;
        v.shape = shape;
        return v;
    }
    explicit LossBatch(bool with_adv = true) {
        args.push_back({"logprobs", view(lp.data(), &n, {RL_DTYPE_FLOAT, 64, 1})});
        if (with_adv) args.push_back({"advantages", view(adv.data(), &n, {RL_DTYPE_FLOAT, 64, 1})});
        in.struct_size = sizeof(in);
        in.tensors = {args.data(), args.size()};
        in.cu_seqlens = view(cu, &cu_shape, {RL_DTYPE_INT, 64, 1});
    }
};

TEST(Loader, LoadsCppAndPlainCPluginsWithTheirDescriptors) {
    Runtime rt(fixture("fixture_good") + ":" + fixture("fixture_plain_c"));
    auto j = rt.list();
    ASSERT_EQ(j["plugins"].size(), 3u) << j.dump(2);
    EXPECT_TRUE(j["refused"].empty()) << j.dump(2);
    std::vector<std::string> names;
    for (const auto &p : j["plugins"])
        names.push_back(p["kind"].get<std::string>() + "/" + p["name"].get<std::string>());
    EXPECT_EQ(names, (std::vector<std::string>{"loss/fixture_sum", "filter/fixture_length",
                                               "loss/my_c_loss"}));
    EXPECT_EQ(j["plugins"][0]["version"], "1.2.3");
    EXPECT_EQ(j["plugins"][0]["abi_version"], "0.7.0");
    EXPECT_NE(j["plugins"][2]["path"].get<std::string>().find("fixture_plain_c.so"),
              std::string::npos);
}

TEST(Loader, RefusesWrongAbiMajorNamingBothVersions) {
    Runtime rt(fixture("fixture_broken_wrong_major"));
    const std::string why = rt.refusal_for("fixture_broken_wrong_major.so");
    EXPECT_NE(why.find("plugin ABI version 1.0.0"), std::string::npos) << why;
    EXPECT_NE(why.find("host's ABI version 0.7.0"), std::string::npos) << why;
    EXPECT_TRUE(rt.list()["plugins"].empty());
}

TEST(Loader, RefusesNewerMinorWhileMajorIsZero) {
    Runtime rt(fixture("fixture_broken_newer_minor"));
    const std::string why = rt.refusal_for("fixture_broken_newer_minor.so");
    EXPECT_NE(why.find("plugin ABI version 0.7.0"), std::string::npos) << why;
}

TEST(Loader, RefusesLibraryWithoutEntrySymbol) {
    Runtime rt(fixture("fixture_broken_no_entry"));
    const std::string why = rt.refusal_for("fixture_broken_no_entry.so");
    EXPECT_NE(why.find("missing the entry symbol 'rl_plugin_entry'"), std::string::npos) << why;
}

TEST(Loader, RefusesGarbageFileNamedSo) {
    Runtime rt(fixture("fixture_garbage"));
    const std::string why = rt.refusal_for("fixture_garbage.so");
    EXPECT_NE(why.find("cannot load the library"), std::string::npos) << why;
}

TEST(Loader, RefusesDuplicatePluginNameAndKeepsTheFirst) {
    Runtime rt(fixture("fixture_good") + ":" + fixture("fixture_z_duplicate"));
    const std::string why = rt.refusal_for("fixture_z_duplicate.so");
    EXPECT_NE(why.find("loss 'fixture_sum': duplicate plugin name"), std::string::npos) << why;
    EXPECT_NE(why.find("fixture_good.so"), std::string::npos) << why;
    auto j = rt.list();
    for (const auto &p : j["plugins"])
        if (p["name"] == "fixture_sum") {
            EXPECT_EQ(p["version"], "1.2.3");
        }
}

TEST(Loader, RefusesPluginWhoseInitFailsWithItsLoggedReason) {
    Runtime rt(fixture("fixture_broken_init_fails"));
    const std::string why = rt.refusal_for("fixture_broken_init_fails.so");
    EXPECT_NE(why.find("init() failed with RL_ERR_DEVICE"), std::string::npos) << why;
    EXPECT_NE(why.find("needs a device that is not present"), std::string::npos) << why;
}

TEST(Loader, FolderScanLoadsGoodLibrariesAndRecordsEveryBrokenOne) {
    Runtime rt(kFixtures);
    auto j = rt.list();
    // good (2), plain C, throws, old minor, and the broken ones that only fail
    // later (bad_id, dup_id's first, null_slot, small_iface, small_plugin)
    EXPECT_EQ(j["plugins"].size(), 10u) << j.dump(2);
    EXPECT_EQ(j["refused"].size(), 9u) << j.dump(2);
}

TEST(Loader, ExplicitLoadOfBrokenFileFailsWithTheReason) {
    Runtime rt("");
    EXPECT_EQ(rl_runtime_load_plugin(rt.rt, fixture("fixture_broken_wrong_major").c_str()),
              RL_ERR_INCOMPATIBLE);
    EXPECT_NE(std::string(rl_last_error()).find("fixture_broken_wrong_major.so"),
              std::string::npos);
    EXPECT_EQ(rl_runtime_load_plugin(rt.rt, (kFixtures + "/does_not_exist.so").c_str()),
              RL_ERR_NOT_FOUND);
    EXPECT_EQ(rl_runtime_load_plugin(rt.rt, fixture("fixture_good").c_str()), RL_OK);
    EXPECT_EQ(rt.list()["plugins"].size(), 2u);
}

TEST(Loader, PlainCLossComputesLossGradientsAndMetrics) {
    Runtime rt(fixture("fixture_plain_c"));
    rl_instance_t *inst = nullptr;
    ASSERT_EQ(rl_instance_create(rt.rt, "loss", "my_c_loss", nullptr, &inst), RL_OK)
        << rl_last_error();
    LossBatch b;
    rl_result_t *r = nullptr;
    ASSERT_EQ(rl_loss_compute(inst, &b.in, 1, &r), RL_OK) << rl_last_error();
    double loss = 0, n = 0;
    EXPECT_EQ(rl_result_scalar(r, "loss", &loss), RL_OK);
    EXPECT_DOUBLE_EQ(loss, -(-1.0 * 1.0 + -2.0 * -1.0 + -0.5 * 2.0) / 3.0);
    EXPECT_EQ(rl_result_metric(r, "n_tokens", &n), RL_OK);
    EXPECT_EQ(n, 3.0);
    rl_tensor_view_t g{};
    ASSERT_EQ(rl_result_tensor(r, "grad.logprobs", &g), RL_OK);
    ASSERT_EQ(g.shape[0], 3);
    const double *gd = static_cast<const double *>(g.data);
    EXPECT_DOUBLE_EQ(gd[0], -1.0 / 3);
    EXPECT_DOUBLE_EQ(gd[1], 1.0 / 3);
    EXPECT_DOUBLE_EQ(gd[2], -2.0 / 3);
    EXPECT_EQ(rl_result_tensor(r, "grad.advantages", &g), RL_ERR_NOT_FOUND);
    rl_result_destroy(r);
    rl_instance_destroy(inst);
}

TEST(Loader, MissingAndUnexpectedLossInputsAreRefusedByName) {
    Runtime rt(fixture("fixture_plain_c"));
    rl_instance_t *inst = nullptr;
    ASSERT_EQ(rl_instance_create(rt.rt, "loss", "my_c_loss", "{}", &inst), RL_OK);
    LossBatch b(false);
    rl_result_t *r = nullptr;
    EXPECT_EQ(rl_loss_compute(inst, &b.in, 1, &r), RL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(rl_last_error()).find("missing required input 'advantages'"),
              std::string::npos)
        << rl_last_error();
    LossBatch typo;
    typo.args[1].name = "advantage";
    EXPECT_EQ(rl_loss_compute(inst, &typo.in, 1, &r), RL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(rl_last_error()).find("unexpected input 'advantage'"), std::string::npos)
        << rl_last_error();
    rl_instance_destroy(inst);
}

TEST(Loader, PluginThatThrowsAcrossTheBoundaryIsAnErrorAndHostKeepsRunning) {
    Runtime rt(fixture("fixture_throws") + ":" + fixture("fixture_good"));
    rl_instance_t *bad = nullptr, *good = nullptr;
    ASSERT_EQ(rl_instance_create(rt.rt, "loss", "fixture_throws", nullptr, &bad), RL_OK);
    LossBatch b(false);
    rl_result_t *r = nullptr;
    EXPECT_EQ(rl_loss_compute(bad, &b.in, 1, &r), RL_ERR_INTERNAL);
    EXPECT_NE(std::string(rl_last_error()).find("loss 'fixture_throws'"), std::string::npos);
    ASSERT_EQ(rl_instance_create(rt.rt, "loss", "fixture_sum", "{\"scale\": 2}", &good), RL_OK);
    ASSERT_EQ(rl_loss_compute(good, &b.in, 0, &r), RL_OK) << rl_last_error();
    double loss = 0;
    EXPECT_EQ(rl_result_scalar(r, "loss", &loss), RL_OK);
    EXPECT_DOUBLE_EQ(loss, 2.0 * 3.5);
    rl_result_destroy(r);
    rl_instance_destroy(bad);
    rl_instance_destroy(good);
}

TEST(Loader, SdkPluginRefusesUnknownAndOutOfRangeParameters) {
    Runtime rt(fixture("fixture_good"));
    rl_instance_t *inst = nullptr;
    EXPECT_EQ(rl_instance_create(rt.rt, "loss", "fixture_sum", "{\"scael\": 2}", &inst),
              RL_ERR_INVALID_ARG);
    EXPECT_NE(
        std::string(rl_last_error()).find("unknown parameter 'scael'; valid parameters: scale"),
        std::string::npos)
        << rl_last_error();
    EXPECT_EQ(rl_instance_create(rt.rt, "loss", "fixture_sum", "{\"scale\": -1}", &inst),
              RL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(rl_last_error()).find("'scale' must be in [0, 100], got -1"),
              std::string::npos)
        << rl_last_error();
    EXPECT_EQ(rl_instance_create(rt.rt, "loss", "fixture_sum", "{not json", &inst),
              RL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(rl_last_error()).find("not valid JSON"), std::string::npos);
    EXPECT_EQ(rl_instance_create(rt.rt, "loss", "no_such_loss", nullptr, &inst), RL_ERR_NOT_FOUND);
    EXPECT_NE(std::string(rl_last_error()).find("available: fixture_sum"), std::string::npos)
        << rl_last_error();
    EXPECT_EQ(rl_instance_create(rt.rt, "lost", "fixture_sum", nullptr, &inst), RL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(rl_last_error()).find("unknown plugin kind 'lost'"), std::string::npos);
}

TEST(Loader, NanInputIsReportedNotPropagated) {
    Runtime rt(fixture("fixture_good"));
    rl_instance_t *inst = nullptr;
    ASSERT_EQ(rl_instance_create(rt.rt, "loss", "fixture_sum", nullptr, &inst), RL_OK);
    LossBatch b(false);
    b.lp[1] = std::nan("");
    rl_result_t *r = nullptr;
    EXPECT_EQ(rl_loss_compute(inst, &b.in, 1, &r), RL_ERR_NUMERIC);
    EXPECT_NE(std::string(rl_last_error()).find("input 'logprobs' has NaN at token 1"),
              std::string::npos)
        << rl_last_error();
    rl_instance_destroy(inst);
}

TEST(Loader, FilterEnforceIsHostPolicyAndReachesTheResult) {
    Runtime rt(fixture("fixture_good"));
    rl_instance_t *inst = nullptr;
    ASSERT_EQ(rl_instance_create(rt.rt, "filter", "fixture_length",
                                 "{\"max_len\": 2, \"enforce\": true}", &inst),
              RL_OK)
        << rl_last_error();
    int64_t ids[3] = {1, 2, 3}, n = 3;
    double lps[3] = {-1, -1, -1};
    rl_rollout_view_t ro{};
    ro.struct_size = sizeof(ro);
    ro.token_ids = LossBatch::view(ids, &n, {RL_DTYPE_INT, 64, 1});
    ro.logprobs = LossBatch::view(lps, &n, {RL_DTYPE_FLOAT, 64, 1});
    ro.vocab_size = 10;
    rl_result_t *r = nullptr;
    ASSERT_EQ(rl_filter_check(inst, &ro, &r), RL_OK) << rl_last_error();
    double flagged = 0, enforce = 0;
    rl_string_view_t reason{};
    EXPECT_EQ(rl_result_scalar(r, "flagged", &flagged), RL_OK);
    EXPECT_EQ(rl_result_scalar(r, "enforce", &enforce), RL_OK);
    EXPECT_EQ(rl_result_text(r, "reason", &reason), RL_OK);
    EXPECT_EQ(flagged, 1.0);
    EXPECT_EQ(enforce, 1.0);
    EXPECT_EQ(std::string(reason.data, reason.length), "too_long");
    rl_result_destroy(r);
    EXPECT_EQ(rl_filter_check(nullptr, &ro, &r), RL_ERR_INVALID_ARG);
    rl_instance_destroy(inst);
}

TEST(Loader, CallingAnInstanceOfTheWrongKindIsRefused) {
    Runtime rt(fixture("fixture_good"));
    rl_instance_t *inst = nullptr;
    ASSERT_EQ(rl_instance_create(rt.rt, "filter", "fixture_length", nullptr, &inst), RL_OK);
    LossBatch b;
    rl_result_t *r = nullptr;
    EXPECT_EQ(rl_loss_compute(inst, &b.in, 1, &r), RL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(rl_last_error()).find("is not a loss plugin"), std::string::npos);
    rl_instance_destroy(inst);
}

TEST(Loader, RuntimeDestroyReleasesInstancesStillAlive) {
    Runtime *rt = new Runtime(fixture("fixture_good"));
    rl_instance_t *inst = nullptr;
    ASSERT_EQ(rl_instance_create(rt->rt, "loss", "fixture_sum", nullptr, &inst), RL_OK);
    delete rt; // must not leak or crash (checked under ASan)
}

TEST(Loader, PluginBuiltForAbi01LoadsComputesAndIsDestroyed) {
    Runtime rt(fixture("fixture_old_minor"));
    auto j = rt.list();
    ASSERT_EQ(j["plugins"].size(), 1u) << j.dump(2);
    EXPECT_EQ(j["plugins"][0]["abi_version"], "0.1.0");
    rl_instance_t *inst = nullptr;
    ASSERT_EQ(rl_instance_create(rt.rt, "loss", "fixture_old_minor", "{\"a\": 1}", &inst), RL_OK)
        << rl_last_error();
    rl_result_t *r = nullptr;
    ASSERT_EQ(rl_loss_signature(inst, &r), RL_OK) << rl_last_error();
    rl_result_destroy(r);
    LossBatch b(false);
    ASSERT_EQ(rl_loss_compute(inst, &b.in, 1, &r), RL_OK) << rl_last_error();
    double loss = 0, tokens = 0;
    EXPECT_EQ(rl_result_scalar(r, "loss", &loss), RL_OK);
    EXPECT_DOUBLE_EQ(loss, 3.5);
    EXPECT_EQ(rl_result_metric(r, "tokens", &tokens), RL_OK);
    EXPECT_EQ(tokens, 3.0);
    rl_tensor_view_t g{};
    ASSERT_EQ(rl_result_tensor(r, "grad.logprobs", &g), RL_OK);
    EXPECT_DOUBLE_EQ(static_cast<const double *>(g.data)[2], -1.0);
    rl_result_destroy(r);
    // Its rl_plugin_t has no get_params (0.1): the host answers with what it gave create().
    ASSERT_EQ(rl_instance_params(inst, &r), RL_OK) << rl_last_error();
    rl_string_view_t p{};
    double from_plugin = -1;
    EXPECT_EQ(rl_result_text(r, "params", &p), RL_OK);
    EXPECT_EQ(std::string(p.data, p.length), "{\"a\": 1}");
    EXPECT_EQ(rl_result_scalar(r, "from_plugin", &from_plugin), RL_OK);
    EXPECT_EQ(from_plugin, 0.0);
    rl_result_destroy(r);
    rl_instance_destroy(inst);
}

TEST(Loader, SdkPluginReportsEffectiveParamsThroughGetParams) {
    Runtime rt(fixture("fixture_good"));
    rl_instance_t *inst = nullptr;
    ASSERT_EQ(rl_instance_create(rt.rt, "loss", "fixture_sum", nullptr, &inst), RL_OK);
    rl_result_t *r = nullptr;
    ASSERT_EQ(rl_instance_params(inst, &r), RL_OK) << rl_last_error();
    rl_string_view_t p{};
    double from_plugin = -1;
    EXPECT_EQ(rl_result_text(r, "params", &p), RL_OK);
    EXPECT_EQ(nlohmann::json::parse(std::string(p.data, p.length)),
              (nlohmann::json{{"scale", 1.0}}));
    EXPECT_EQ(rl_result_scalar(r, "from_plugin", &from_plugin), RL_OK);
    EXPECT_EQ(from_plugin, 1.0);
    rl_result_destroy(r);
    rl_instance_destroy(inst);
}

TEST(Loader, RefusesMalformedDescriptorsAndInstancesNamingStructAndSizes) {
    Runtime rt(fixture("fixture_broken_small_desc") + ":" + fixture("fixture_broken_missing_name") +
               ":" + fixture("fixture_broken_dup_id") + ":" +
               fixture("fixture_broken_small_iface"));
    std::string why = rt.refusal_for("fixture_broken_small_desc.so");
    EXPECT_NE(why.find("rl_plugin_desc_t has struct_size 24, smaller than 56 bytes"),
              std::string::npos)
        << why;
    EXPECT_NE(why.find("the plugin declares ABI 0.7.0, the host is ABI 0.7.0"), std::string::npos)
        << why;
    why = rt.refusal_for("fixture_broken_missing_name.so");
    EXPECT_NE(why.find("descriptor is incomplete: name is NULL"), std::string::npos) << why;
    why = rt.refusal_for("fixture_broken_dup_id.so");
    EXPECT_NE(why.find("duplicate plugin id 'org.rl.test.broken'"), std::string::npos) << why;
    rl_instance_t *inst = nullptr;
    EXPECT_EQ(rl_instance_create(rt.rt, "loss", "fixture_small_iface", nullptr, &inst),
              RL_ERR_INCOMPATIBLE);
    const std::string err = rl_last_error();
    EXPECT_NE(err.find("fixture_broken_small_iface.so: loss 'fixture_small_iface'"),
              std::string::npos)
        << err;
    EXPECT_NE(err.find("rl_loss_iface_t has struct_size 8, smaller than 24 bytes"),
              std::string::npos)
        << err;
}

TEST(HostExtensions, KnownIdsAnswerAndUnknownIdsAreNull) {
    Runtime rt(fixture("fixture_good"));
    rl_instance_t *inst = nullptr;
    ASSERT_EQ(rl_instance_create(rt.rt, "loss", "fixture_sum", nullptr, &inst), RL_OK);
    LossBatch b(false);
    auto metric = [](rl_result_t *r, const char *name) {
        double v = -1;
        EXPECT_EQ(rl_result_metric(r, name, &v), RL_OK) << name;
        return v;
    };
    rl_result_t *r = nullptr;
    ASSERT_EQ(rl_loss_compute(inst, &b.in, 0, &r), RL_OK) << rl_last_error();
    EXPECT_EQ(metric(r, "ext.thread_check"), 1.0);
    EXPECT_EQ(metric(r, "ext.unknown"), 0.0);
    EXPECT_EQ(metric(r, "ext.control_thread"), 1.0); // the runtime was created on this thread
    EXPECT_EQ(metric(r, "ext.metric_reduced"), 1.0); // ABI 0.6 slot
    EXPECT_EQ(metric(r, "ext.metric_reduced_refusals"), 3.0);
    EXPECT_EQ(metric(r, "tokens_max"), metric(r, "tokens"));
    rl_result_destroy(r);
    std::thread worker(
        [&] { ASSERT_EQ(rl_loss_compute(inst, &b.in, 0, &r), RL_OK) << rl_last_error(); });
    worker.join();
    EXPECT_EQ(metric(r, "ext.control_thread"), 0.0);
    rl_result_destroy(r);
    rl_instance_destroy(inst);
}

TEST(StatusNames, EveryStatusHasAStableName) {
    EXPECT_STREQ(rl_status_name(RL_OK), "RL_OK");
    EXPECT_STREQ(rl_status_name(RL_ERR_INCOMPATIBLE), "RL_ERR_INCOMPATIBLE");
    EXPECT_STREQ(rl_status_name(RL_ERR_NUMERIC), "RL_ERR_NUMERIC");
    EXPECT_STREQ(rl_status_name(9999), "RL_ERR_<unlisted>");
    EXPECT_EQ(rl_get_abi_version(), static_cast<uint32_t>(RL_ABI_VERSION));
}

} // namespace
