// The plugin host against real fixture libraries, through the C API only.
#include <rl_api.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

namespace {

const std::string kFixtures = RL_TEST_FIXTURE_DIR;
// Fixtures no folder scan meets (fixture_broken_huge_count).
const std::string kUnscannedFixtures = RL_TEST_UNSCANNED_FIXTURE_DIR;

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
    EXPECT_EQ(j["plugins"][0]["abi_version"], "0.10.0");
    EXPECT_NE(j["plugins"][2]["path"].get<std::string>().find("fixture_plain_c.so"),
              std::string::npos);
}

TEST(Loader, RefusesWrongAbiMajorNamingBothVersions) {
    Runtime rt(fixture("fixture_broken_wrong_major"));
    const std::string why = rt.refusal_for("fixture_broken_wrong_major.so");
    EXPECT_NE(why.find("plugin ABI version 1.0.0"), std::string::npos) << why;
    EXPECT_NE(why.find("host's ABI version 0.10.0"), std::string::npos) << why;
    EXPECT_TRUE(rt.list()["plugins"].empty());
}

TEST(Loader, RefusesNewerMinorWhileMajorIsZero) {
    Runtime rt(fixture("fixture_broken_newer_minor"));
    const std::string why = rt.refusal_for("fixture_broken_newer_minor.so");
    EXPECT_NE(why.find("plugin ABI version 0.11.0"), std::string::npos) << why;
}

TEST(Loader, RefusesLibraryWithoutEntrySymbol) {
    Runtime rt(fixture("fixture_broken_no_entry"));
    const std::string why = rt.refusal_for("fixture_broken_no_entry.so");
    EXPECT_NE(why.find("missing the entry symbol 'rl_plugin_entry'"), std::string::npos) << why;
}

TEST(Loader, RefusesGarbageFileNamedSo) {
    Runtime rt(fixture("fixture_garbage"));
    const std::string why = rt.refusal_for("fixture_garbage.so");
    EXPECT_NE(why.find("not an ELF file: it does not start with the ELF magic"), std::string::npos)
        << why;
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
    // later (bad_id, dup_id's first, null_slot, small_iface, small_plugin,
    // bad_text's good one)
    EXPECT_EQ(j["plugins"].size(), 11u) << j.dump(2);
    // 9, and bad_text's four descriptors, too_many and the two truncated copies
    // of fixture_good (refused before dlopen, which would fault)
    EXPECT_EQ(j["refused"].size(), 16u) << j.dump(2);
    EXPECT_NE(rt.refusal_for("fixture_truncated_head.so").find("the file is truncated or corrupt"),
              std::string::npos)
        << j.dump(2);
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
    EXPECT_NE(why.find("the plugin declares ABI 0.10.0, the host is ABI 0.10.0"), std::string::npos)
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

// host.h: mem_alloc takes any power-of-two alignment (0: 16). The fixture asks
// from inside a call (tests/host/fixtures/good_cpp.cpp) and reports.
TEST(HostAllocator, EveryPowerOfTwoAlignmentIsServedAndAnUnroundableSizeIsNull) {
    Runtime rt(fixture("fixture_good"));
    rl_instance_t *inst = nullptr;
    ASSERT_EQ(rl_instance_create(rt.rt, "loss", "fixture_sum", nullptr, &inst), RL_OK);
    LossBatch b(false);
    rl_result_t *r = nullptr;
    ASSERT_EQ(rl_loss_compute(inst, &b.in, 0, &r), RL_OK) << rl_last_error();
    double aligned = 0, huge_null = 0, odd_null = 0;
    EXPECT_EQ(rl_result_metric(r, "mem.aligned", &aligned), RL_OK);
    EXPECT_EQ(rl_result_metric(r, "mem.huge_is_null", &huge_null), RL_OK);
    EXPECT_EQ(rl_result_metric(r, "mem.odd_align_is_null", &odd_null), RL_OK);
    EXPECT_EQ(aligned, 7.0);   // align 0, 1, 2, 4, 8, 64, 4096
    EXPECT_EQ(huge_null, 1.0); // SIZE_MAX - 2 at align 64 does not wrap to a small block
    EXPECT_EQ(odd_null, 1.0);  // align 24
    rl_result_destroy(r);
    rl_instance_destroy(inst);
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

// ---- hostile or broken files and strings -----------------------------------

namespace fs = std::filesystem;

// A scratch folder, removed with everything in it on scope exit.
struct ScratchDir {
    fs::path path;
    ScratchDir() {
        std::string tmpl = (fs::temp_directory_path() / "rl_loader_test_XXXXXX").string();
        path = ::mkdtemp(tmpl.data()) ? fs::path(tmpl) : fs::path();
        EXPECT_FALSE(path.empty()) << std::strerror(errno);
    }
    ~ScratchDir() {
        std::error_code ec;
        fs::remove_all(path, ec);
    }
    std::string operator/(const std::string &name) const { return (path / name).string(); }
};

std::vector<char> read_bytes(const std::string &path) {
    std::ifstream in(path, std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string &path, const std::vector<char> &bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// fixture_good.so's bytes, to cut or patch.
std::vector<char> good_library() {
    auto bytes = read_bytes(fixture("fixture_good"));
    EXPECT_GT(bytes.size(), sizeof(ElfW(Ehdr)));
    return bytes;
}

template <typename T>
void patch(std::vector<char> &bytes, size_t offset, T value) {
    std::memcpy(bytes.data() + offset, &value, sizeof value);
}

// rl_runtime_load_plugin's status and message for one file.
std::pair<rl_status_t, std::string> explicit_load(const std::string &path) {
    Runtime rt("");
    const rl_status_t st = rl_runtime_load_plugin(rt.rt, path.c_str());
    return {st, rl_last_error()};
}

// Runs `f` on a thread; should it block on the FIFO at `fifo` (the regression:
// dlopen opening a FIFO waits for a writer forever), opens the FIFO for writing
// so that it returns, and fails the test.
template <typename F>
auto without_blocking_on(const std::string &fifo, F f) {
    auto done = std::async(std::launch::async, f);
    if (done.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
        ADD_FAILURE() << "blocked opening the FIFO " << fifo;
        while (done.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) {
            const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
            if (fd >= 0) ::close(fd);
        }
    }
    return done.get();
}

TEST(LoaderHostileFiles, TruncatedLibrariesInAFolderAreRefusedAndTheOthersLoad) {
    ScratchDir dir;
    const auto bytes = good_library();
    write_bytes(dir / "a_good.so", bytes);
    write_bytes(dir / "head.so", {bytes.begin(), bytes.begin() + 3000});
    const size_t half = bytes.size() / 2;
    write_bytes(dir / "half.so", {bytes.begin(), bytes.begin() + static_cast<long>(half)});
    write_bytes(dir / "short_header.so", {bytes.begin(), bytes.begin() + 40});
    Runtime rt(dir.path.string());
    const auto j = rt.list();
    EXPECT_EQ(j["plugins"].size(), 2u) << j.dump(2);
    EXPECT_EQ(j["refused"].size(), 3u) << j.dump(2);
    std::string why = rt.refusal_for("head.so");
    EXPECT_NE(why.find("the file is truncated or corrupt: segment "), std::string::npos) << why;
    EXPECT_NE(why.find("(PT_LOAD, "), std::string::npos) << why;
    EXPECT_NE(why.find("ends past the end of the file (3000 bytes)"), std::string::npos) << why;
    why = rt.refusal_for("half.so");
    EXPECT_NE(why.find("the file is truncated or corrupt: "), std::string::npos) << why;
    EXPECT_NE(why.find("ends past the end of the file (" + std::to_string(half) + " bytes)"),
              std::string::npos)
        << why;
    why = rt.refusal_for("short_header.so");
    EXPECT_NE(why.find("the ELF header (64 bytes at offset 0) ends past the end of the file (40 "
                       "bytes)"),
              std::string::npos)
        << why;
}

TEST(LoaderHostileFiles, ExplicitTruncatedLibraryFailsNamingTheFile) {
    ScratchDir dir;
    const auto bytes = good_library();
    write_bytes(dir / "head.so", {bytes.begin(), bytes.begin() + 3000});
    const auto [st, msg] = explicit_load(dir / "head.so");
    EXPECT_EQ(st, RL_ERR_IO);
    EXPECT_NE(msg.find(dir / "head.so" + ": the file is truncated or corrupt: segment"),
              std::string::npos)
        << msg;
}

TEST(LoaderHostileFiles, HeaderTablesPastTheEndOfTheFileAreRefused) {
    ScratchDir dir;
    const auto bytes = good_library();
    const uint64_t size = bytes.size();
    auto ph = bytes;
    patch<ElfW(Off)>(ph, offsetof(ElfW(Ehdr), e_phoff), size - 8);
    write_bytes(dir / "ph.so", ph);
    auto [st, msg] = explicit_load(dir / "ph.so");
    EXPECT_EQ(st, RL_ERR_IO);
    EXPECT_NE(msg.find("its program header table ("), std::string::npos) << msg;
    EXPECT_NE(msg.find("at offset " + std::to_string(size - 8) + ") ends past the end of the file"),
              std::string::npos)
        << msg;
    auto sh = bytes;
    patch<ElfW(Off)>(sh, offsetof(ElfW(Ehdr), e_shoff), size - 8);
    write_bytes(dir / "sh.so", sh);
    std::tie(st, msg) = explicit_load(dir / "sh.so");
    EXPECT_EQ(st, RL_ERR_IO);
    EXPECT_NE(msg.find("its section header table ("), std::string::npos) << msg;
    EXPECT_NE(msg.find("at offset " + std::to_string(size - 8) + ") ends past the end of the file"),
              std::string::npos)
        << msg;
    // A segment whose offset + size wraps around 2^64 is past the end too.
    auto wrap = bytes;
    const auto *eh = reinterpret_cast<const ElfW(Ehdr) *>(bytes.data());
    patch<ElfW(Off)>(wrap, eh->e_phoff + offsetof(ElfW(Phdr), p_offset), ~ElfW(Off){0});
    write_bytes(dir / "wrap.so", wrap);
    std::tie(st, msg) = explicit_load(dir / "wrap.so");
    EXPECT_EQ(st, RL_ERR_IO);
    EXPECT_NE(msg.find("segment 0 ("), std::string::npos) << msg;
}

TEST(LoaderHostileFiles, LibraryForAnotherClassByteOrderMachineOrTypeIsIncompatible) {
    ScratchDir dir;
    const auto bytes = good_library();
    const auto *eh = reinterpret_cast<const ElfW(Ehdr) *>(bytes.data());
    struct Case {
        const char *file;
        size_t offset;
        uint16_t value;
        bool one_byte;
        const char *expect;
    };
    const uint16_t other_machine = eh->e_machine == EM_AARCH64 ? EM_X86_64 : EM_AARCH64;
    const Case cases[] = {
        {"class.so", EI_CLASS, ELFCLASS32, true,
         "the library is 32-bit (ELFCLASS32); this host "
         "loads 64-bit (ELFCLASS64) libraries"},
        {"order.so", EI_DATA, ELFDATA2MSB, true, "the library's byte order is big-endian"},
        {"machine.so", offsetof(ElfW(Ehdr), e_machine), other_machine, false,
         "the library is built for "},
        {"type.so", offsetof(ElfW(Ehdr), e_type), ET_EXEC, false,
         "not a shared object: ELF type 2 (an executable), expected ET_DYN"},
    };
    for (const Case &c : cases) {
        auto patched = bytes;
        if (c.one_byte)
            patched[c.offset] = static_cast<char>(c.value);
        else
            patch<uint16_t>(patched, c.offset, c.value);
        write_bytes(dir / c.file, patched);
        const auto [st, msg] = explicit_load(dir / c.file);
        EXPECT_EQ(st, RL_ERR_INCOMPATIBLE) << c.file << ": " << msg;
        EXPECT_NE(msg.find(dir / c.file + ": " + c.expect), std::string::npos) << msg;
    }
}

TEST(LoaderHostileFiles, ExplicitFifoAndDeviceAreRefusedWithoutBlocking) {
    ScratchDir dir;
    const std::string fifo = dir / "fifo.so";
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
    const auto [st, msg] = without_blocking_on(fifo, [&] { return explicit_load(fifo); });
    EXPECT_EQ(st, RL_ERR_INVALID_ARG);
    EXPECT_NE(msg.find(fifo + ": the file is a FIFO (named pipe), not a regular file"),
              std::string::npos)
        << msg;
    const auto [dst, dmsg] = explicit_load("/dev/null");
    EXPECT_EQ(dst, RL_ERR_INVALID_ARG);
    EXPECT_NE(dmsg.find("/dev/null: the file is a character device, not a regular file"),
              std::string::npos)
        << dmsg;
}

TEST(LoaderHostileFiles, FolderScanRefusesFifoSocketAndDeviceAndLoadsTheRest) {
    ScratchDir dir;
    write_bytes(dir / "good.so", good_library());
    const std::string fifo = dir / "fifo.so";
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
    fs::create_symlink(fifo, dir / "link_to_fifo.so");
    fs::create_symlink("/dev/null", dir / "null.so");
    fs::create_directory(dir / "folder.so"); // folders are not scanned, nor refused
    const int sock = ::socket(AF_UNIX, SOCK_STREAM, 0);
    ASSERT_GE(sock, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    const std::string sock_path = dir / "sock.so";
    ASSERT_LT(sock_path.size(), sizeof addr.sun_path);
    std::strcpy(addr.sun_path, sock_path.c_str());
    ASSERT_EQ(::bind(sock, reinterpret_cast<sockaddr *>(&addr), sizeof addr), 0)
        << std::strerror(errno);
    const nlohmann::json j = without_blocking_on(fifo, [&] {
        Runtime rt(dir.path.string());
        return rt.list();
    });
    ::close(sock);
    EXPECT_EQ(j["plugins"].size(), 2u) << j.dump(2);
    std::vector<std::string> refused;
    for (const auto &r : j["refused"]) {
        const std::string why = r["reason"].get<std::string>();
        refused.push_back(fs::path(r["path"].get<std::string>()).filename().string() + ": " +
                          why.substr(0, why.find(", not a regular file")));
    }
    // link_to_fifo.so is refused under its target's name, null.so under /dev/null
    EXPECT_EQ(refused, (std::vector<std::string>{"fifo.so: the file is a FIFO (named pipe)",
                                                 "fifo.so: the file is a FIFO (named pipe)",
                                                 "null: the file is a character device",
                                                 "sock.so: the file is a socket"}))
        << j.dump(2);
}

TEST(LoaderHostileFiles, DanglingSymlinkIsRefusedNamingItsTargetNotSkipped) {
    ScratchDir dir;
    write_bytes(dir / "good.so", good_library());
    const std::string link = dir / "gone.so";
    fs::create_symlink(dir / "removed_build/rl-loss-x.so", link);
    Runtime rt(dir.path.string());
    const nlohmann::json j = rt.list();
    EXPECT_EQ(j["plugins"].size(), 2u) << j.dump(2); // good.so's two
    ASSERT_EQ(j["refused"].size(), 1u) << j.dump(2);
    EXPECT_EQ(j["refused"][0]["path"], link);
    EXPECT_NE(j["refused"][0]["reason"].get<std::string>().find(
                  "a symbolic link to '" + (dir / "removed_build/rl-loss-x.so") +
                  "', which does not exist"),
              std::string::npos)
        << j.dump(2);
    const auto [st, msg] = explicit_load(link);
    EXPECT_EQ(st, RL_ERR_NOT_FOUND);
    EXPECT_NE(msg.find(link + ": a symbolic link to"), std::string::npos) << msg;
}

TEST(LoaderHostileStrings, DescriptorStringsThatAreNotTextAreRefusedEscaped) {
    Runtime rt(fixture("fixture_broken_bad_text"));
    const auto j = rt.list(); // a valid JSON document (it used to fail: type_error 316)
    ASSERT_EQ(j["plugins"].size(), 1u) << j.dump(2);
    EXPECT_EQ(j["plugins"][0]["name"], "fixture_text_ok");
    std::vector<std::string> reasons;
    for (const auto &r : j["refused"]) reasons.push_back(r["reason"].get<std::string>());
    const std::string digits = "0123456789012345678901234567890123456789012345678901234567890123";
    EXPECT_EQ(
        reasons,
        (std::vector<std::string>{
            R"(plugin 0: descriptor field 'name' is not valid UTF-8 (byte 0xff at offset 8): "fixture_\xff\xfe_name")",
            R"(plugin 1: descriptor field 'id' contains the control character U+001B at offset 12: "org.rl.test.\x1b[31mred")",
            "plugin 2: descriptor field 'version' is longer than 256 bytes: \"" + digits + "...\"",
            R"(plugin 3: descriptor field 'description' is not valid UTF-8 (byte 0xc3 at offset 18): "half a character: \xc3")"}))
        << j.dump(2);
}

TEST(LoaderHostileStrings, PluginNamesTextsAndMessagesThatAreNotTextStayReadable) {
    Runtime rt(fixture("fixture_broken_bad_text"));
    rl_instance_t *inst = nullptr;
    EXPECT_EQ(rl_instance_create(rt.rt, "loss", "fixture_text_ok", "{\"fail\": 1}", &inst),
              RL_ERR_INVALID_ARG);
    EXPECT_EQ(std::string(rl_last_error()), R"(refused \xff\x1b[2J here)");
    ASSERT_EQ(rl_instance_create(rt.rt, "loss", "fixture_text_ok", nullptr, &inst), RL_OK)
        << rl_last_error();
    rl_result_t *r = nullptr;
    ASSERT_EQ(rl_loss_signature(inst, &r), RL_OK) << rl_last_error();
    rl_string_view_t s{};
    ASSERT_EQ(rl_result_text(r, "signature", &s), RL_OK);
    const auto sig = nlohmann::json::parse(std::string(s.data, s.length));
    EXPECT_EQ(sig["optional"][0], "weight_\xEF\xBF\xBD") << sig.dump(); // U+FFFD
    rl_result_destroy(r);
    LossBatch b(false);
    ASSERT_EQ(rl_loss_compute(inst, &b.in, 0, &r), RL_OK) << rl_last_error();
    ASSERT_EQ(rl_result_json(r, &s), RL_OK) << rl_last_error();
    const auto out = nlohmann::json::parse(std::string(s.data, s.length));
    EXPECT_EQ(out["metrics"]["tokens_\xEF\xBF\xBD"], 3.0) << out.dump();
    EXPECT_EQ(out["texts"]["note_\xEF\xBF\xBD"], "\xEF\xBF\xBD(") << out.dump();
    double tokens = 0;
    EXPECT_EQ(rl_result_metric(r, "tokens_\xfe", &tokens), RL_OK); // the name as emitted
    EXPECT_EQ(tokens, 3.0);
    rl_result_destroy(r);
    rl_instance_destroy(inst);
}

// runtime.h: readers of one result may run at the same time. The first
// rl_result_json makes the text once; every reader gets that same text (the
// same bytes at the same address), however many ask at once.
TEST(LoaderResults, ResultJsonReadFromSeveralThreadsAtOnceIsMadeOnce) {
    Runtime rt(fixture("fixture_broken_bad_text"));
    rl_instance_t *inst = nullptr;
    ASSERT_EQ(rl_instance_create(rt.rt, "loss", "fixture_text_ok", nullptr, &inst), RL_OK)
        << rl_last_error();
    LossBatch b(false);
    for (int round = 0; round < 200; ++round) {
        rl_result_t *r = nullptr;
        ASSERT_EQ(rl_loss_compute(inst, &b.in, 0, &r), RL_OK) << rl_last_error();
        constexpr int kReaders = 4;
        std::atomic<int> ready{0};
        std::vector<rl_string_view_t> views(kReaders);
        std::vector<std::string> texts(kReaders);
        std::vector<rl_status_t> status(kReaders, RL_ERR_INTERNAL);
        std::vector<std::thread> readers;
        for (int t = 0; t < kReaders; ++t)
            readers.emplace_back([&, t] {
                ready.fetch_add(1);
                while (ready.load() < kReaders) {
                }
                status[t] = rl_result_json(r, &views[t]);
                texts[t] = std::string(views[t].data, views[t].length);
            });
        for (auto &th : readers) th.join();
        for (int t = 0; t < kReaders; ++t) {
            ASSERT_EQ(status[t], RL_OK) << "round " << round << ", reader " << t;
            ASSERT_EQ(views[t].data, views[0].data) << "round " << round << ", reader " << t;
            ASSERT_EQ(texts[t], texts[0]) << "round " << round;
        }
        EXPECT_NE(texts[0].find("\"metrics\""), std::string::npos) << texts[0];
        rl_result_destroy(r);
    }
    rl_instance_destroy(inst);
}

// The reason a library of `file` (under `dir`) was refused, when it was the only one.
std::string only_refusal(const std::string &dir, const std::string &file) {
    Runtime rt(dir + "/" + file + ".so");
    const auto j = rt.list();
    EXPECT_TRUE(j["plugins"].empty()) << j.dump(2);
    EXPECT_EQ(j["refused"].size(), 1u) << file; // one refusal, not one per descriptor
    return j["refused"].empty() ? "" : j["refused"][0]["reason"].get<std::string>();
}

TEST(LoaderLimits, LibraryReportingMorePluginsThanTheLimitIsRefusedAsAWhole) {
    const std::string limit = " one library may hold; the library is refused as a whole";
    ASSERT_EQ(only_refusal(kFixtures, "fixture_broken_too_many"),
              "the plugin factory's count() reports 4097 plugins, more than the 4096" + limit);
    // 2^32-1 descriptors (asked only when the limit holds: without it, walking and
    // refusing them one by one would fill the memory). Its folder is not scanned
    // by the other tests.
    EXPECT_EQ(only_refusal(kUnscannedFixtures, "fixture_broken_huge_count"),
              "the plugin factory's count() reports 4294967295 plugins, more than the 4096" +
                  limit);
}

TEST(StatusNames, EveryStatusHasAStableName) {
    EXPECT_STREQ(rl_status_name(RL_OK), "RL_OK");
    EXPECT_STREQ(rl_status_name(RL_ERR_INCOMPATIBLE), "RL_ERR_INCOMPATIBLE");
    EXPECT_STREQ(rl_status_name(RL_ERR_NUMERIC), "RL_ERR_NUMERIC");
    EXPECT_STREQ(rl_status_name(9999), "RL_ERR_<unlisted>");
    EXPECT_EQ(rl_get_abi_version(), static_cast<uint32_t>(RL_ABI_VERSION));
}

TEST(Versions, LibrlReportsThePluginAbiAndTheEmbedderApiSeparately) {
    EXPECT_EQ(rl_get_abi_version(), static_cast<uint32_t>(RL_PLUGIN_ABI_VERSION));
    EXPECT_EQ(rl_get_api_version(), static_cast<uint32_t>(RL_API_VERSION));
    // The older name is the plugin ABI: every plugin built so far stores it.
    EXPECT_EQ(static_cast<uint32_t>(RL_ABI_VERSION), static_cast<uint32_t>(RL_PLUGIN_ABI_VERSION));
}

} // namespace
