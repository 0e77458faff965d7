// Weight updates of a running `rlhost serve` (in process, on the tiny model)
// through SGLang's protocol, driven by the trainer-side client: from disk,
// from broadcasts over a Gloo weight-update group, from tensors in the
// request; checksums refused; the old weights keep serving after a refusal.
#include "../platform/platform_util.hpp"
#include "../plugin_host/free_port.hpp"

#include "../../host/serve/http.hpp"
#include "../../host/serve/inference_client.hpp"
#include "../../host/serve/server.hpp"
#include "../../host/serve/weight_update.hpp"

#include "rl/core/text.hpp"
#include "rl/core/update_group.hpp"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <future>
#include <limits>

namespace rl::serve {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using core::test::TempDir;

const std::vector<int64_t> kPrompt{104, 101, 108, 108, 111, 10};

// Greedy tokens of a policy, from the engine (the reference).
std::vector<int64_t> greedy(const std::shared_ptr<core::Policy> &policy) {
    core::Engine engine(policy);
    core::SamplingParams sp;
    sp.temperature = 0;
    sp.max_tokens = 16;
    sp.stop_token_ids = std::vector<int64_t>{};
    return engine.generate({kPrompt}, sp).token_ids;
}

class ServeWeights : public ::testing::Test {
protected:
    void SetUp() override {
        core::write_tiny_model(dir / "a", 7);
        core::write_tiny_model(dir / "b", 8); // other weights, same shapes
        policy = core::Policy::load(dir / "a");
        ServerConfig cfg;
        cfg.port = 0;
        cfg.model_path = dir / "a";
        server = std::make_unique<Server>(policy, cfg);
        server->start();
        ClientOptions co;
        co.url = server->url();
        client = std::make_unique<InferenceClient>(co);
        new_weights = core::Policy::load(dir / "b");
        want_a = greedy(core::Policy::load(dir / "a"));
        want_b = greedy(new_weights);
        ASSERT_NE(want_a, want_b) << "the two tiny models must differ";
    }
    void TearDown() override { server->stop(); }

    // Greedy tokens the server produces now.
    std::vector<int64_t> served() const {
        const json r = client->call(
            "POST", "/generate",
            {{"input_ids", kPrompt},
             {"sampling_params",
              {{"temperature", 0}, {"max_new_tokens", 16}, {"stop_token_ids", json::array()}}}});
        return r.at("output_ids").get<std::vector<int64_t>>();
    }
    HttpResponse post(const std::string &path, const json &body) const {
        return http_request(server->url(), "POST", path, body.dump());
    }

    TempDir dir;
    std::shared_ptr<core::Policy> policy, new_weights;
    std::unique_ptr<Server> server;
    std::unique_ptr<InferenceClient> client;
    std::vector<int64_t> want_a, want_b;
};

TEST_F(ServeWeights, UpdateFromDiskMakesGreedyOutputsThoseOfTheNewWeights) {
    EXPECT_EQ(served(), want_a);
    const HttpResponse r =
        post("/update_weights_from_disk", {{"model_path", dir / "b"}, {"weight_version", "4"}});
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_TRUE(json::parse(r.body).at("success").get<bool>());
    EXPECT_EQ(served(), want_b);
    EXPECT_EQ(client->weight_version(), "4");
    EXPECT_EQ(policy->version(), 4);
}

TEST_F(ServeWeights, AChecksumMismatchOnDiskIsRefusedAndTheOldWeightsKeepServing) {
    const fs::path c = fs::path(dir / "c");
    fs::copy(dir / "b", c);
    write_checksums_file(c.string());
    { // corrupt one byte of the data (past the header) after the checksums were taken
        std::fstream f(c / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
        uint64_t header = 0;
        f.read(reinterpret_cast<char *>(&header), 8);
        f.seekg(static_cast<std::streamoff>(8 + header + 100));
        char byte = 0;
        f.read(&byte, 1);
        byte = static_cast<char>(byte ^ 0x40);
        f.seekp(static_cast<std::streamoff>(8 + header + 100));
        f.write(&byte, 1);
    }
    const HttpResponse r = post("/update_weights_from_disk", {{"model_path", c.string()}});
    EXPECT_EQ(r.status, 400) << r.body;
    const json j = json::parse(r.body);
    EXPECT_FALSE(j.at("success").get<bool>());
    EXPECT_NE(j.at("message").get<std::string>().find("fails its checksum"), std::string::npos)
        << r.body;
    EXPECT_EQ(served(), want_a);
    EXPECT_EQ(policy->version(), 0);
}

TEST_F(ServeWeights, DistributedSyncMatchesLoadingTheNewWeightsFromScratch) {
    SyncOptions o;
    o.mode = "distributed";
    o.bucket_bytes = 1 << 20; // several /update_weights_from_distributed calls
    const SyncOutcome out = client->sync(*new_weights, 3, o);
    EXPECT_FALSE(out.skipped);
    EXPECT_EQ(out.server_version, "3");
    EXPECT_EQ(out.tensors, static_cast<int64_t>(new_weights->model().named_weights().size()));
    EXPECT_EQ(served(), want_b);
    // The same version again: the handshake skips it.
    EXPECT_TRUE(client->sync(*new_weights, 3, o).skipped);
    // Back to the first weights, flattened into one buffer per bucket.
    o.flattened = true;
    EXPECT_FALSE(client->sync(*core::Policy::load(dir / "a"), 4, o).skipped);
    EXPECT_EQ(served(), want_a);
}

TEST_F(ServeWeights, AVllmDistributedSyncFromACpuModelIsRefusedAndTheServerResumes) {
    ClientOptions co;
    co.url = server->url();
    co.protocol = "vllm";
    InferenceClient vllm_client(co);
    SyncOptions o;
    o.mode = "distributed";
    try {
        vllm_client.sync(*new_weights, 1, o);
        ADD_FAILURE() << "a vLLM NCCL sync from a CPU model went through";
    } catch (const core::Error &e) {
        EXPECT_NE(std::string(e.what()).find("vLLM's NCCL weight transfer needs the trainer's "
                                             "model on CUDA"),
                  std::string::npos)
            << e.what();
    }
    o.backend = "gloo";
    try {
        vllm_client.sync(*new_weights, 1, o);
        ADD_FAILURE() << "a vLLM sync over gloo went through";
    } catch (const core::Error &e) {
        EXPECT_NE(std::string(e.what()).find("NCCL only"), std::string::npos) << e.what();
    }
    EXPECT_EQ(served(), want_a); // resumed, old weights
}

TEST_F(ServeWeights, VllmsReadOnlyWeightTransferRoutesAnswerWithVllmsShapes) {
    auto get = [&](const std::string &target) {
        return http_request(server->url(), "GET", target, "");
    };
    // /get_world_size: {"world_size"}, with and without data parallelism.
    for (const char *target :
         {"/get_world_size", "/get_world_size?include_dp=true", "/get_world_size?include_dp=False",
          "/get_world_size?include_dp=0"}) {
        const HttpResponse r = get(target);
        ASSERT_EQ(r.status, 200) << target << " -> " << r.body;
        EXPECT_EQ(json::parse(r.body), json({{"world_size", 1}})) << target;
    }
    const HttpResponse bad = get("/get_world_size?include_dp=maybe");
    EXPECT_EQ(bad.status, 400) << bad.body;
    EXPECT_NE(bad.body.find("include_dp must be a boolean"), std::string::npos) << bad.body;
    EXPECT_NE(bad.body.find("\"param\":\"include_dp\""), std::string::npos) << bad.body;
    // /weight_info: {"weight_version"}, the version the weights in use carry.
    HttpResponse info = get("/weight_info");
    ASSERT_EQ(info.status, 200) << info.body;
    EXPECT_EQ(json::parse(info.body), json({{"weight_version", server->weight_version()}}));
    ASSERT_EQ(
        post("/update_weights_from_disk", {{"model_path", dir / "b"}, {"weight_version", "7"}})
            .status,
        200);
    info = get("/weight_info");
    EXPECT_EQ(json::parse(info.body), json({{"weight_version", "7"}}));
    // /weight_checker digests vLLM's own fused parameters: refused, saying so.
    const HttpResponse checker = post("/weight_checker", {{"action", "checksum"}});
    EXPECT_EQ(checker.status, 400) << checker.body;
    EXPECT_NE(checker.body.find("/weight_checker is not served"), std::string::npos)
        << checker.body;
}

TEST_F(ServeWeights, TheVllmUniqueIdRendezvousSendsTheIdAsStandardBase64InsteadOfTheStore) {
    SyncOptions o = SyncOptions::from_json({{"mode", "distributed"}, {"rendezvous", "unique_id"}});
    EXPECT_EQ(o.rendezvous, "unique_id");
    std::array<uint8_t, 128> id{};
    for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<uint8_t>(251 + i); // '+' and '/'
    const json uid = vllm_init_info(o, 1, 0, &id);
    EXPECT_FALSE(uid.contains("master_address")) << uid.dump();
    EXPECT_FALSE(uid.contains("master_port")) << uid.dump();
    const std::string b64 = uid.at("nccl_unique_id_b64");
    EXPECT_EQ(b64, core::base64_encode(id.data(), id.size()));
    EXPECT_NE(b64.find_first_of("+/"), std::string::npos) << "standard alphabet, not URL-safe";
    EXPECT_EQ(b64.back(), '=');
    EXPECT_EQ(uid.at("rank_offset"), 1);
    EXPECT_EQ(uid.at("world_size"), 2);
    o.rendezvous = "store";
    const json store = vllm_init_info(o, 1, 4567, nullptr);
    EXPECT_FALSE(store.contains("nccl_unique_id_b64")) << store.dump();
    EXPECT_EQ(store.at("master_address"), "127.0.0.1");
    EXPECT_EQ(store.at("master_port"), 4567);
    // Both bodies pass this server's checks of vLLM's init_info: a CPU server
    // refuses them only for want of CUDA.
    for (const json &info : {uid, store}) {
        const HttpResponse r = post("/init_weight_transfer_engine", {{"init_info", info}});
        EXPECT_EQ(r.status, 400) << r.body;
        EXPECT_NE(r.body.find("needs the model on a CUDA device"), std::string::npos) << r.body;
    }
    // The key names its values; only vLLM's NCCL transfer has the mode.
    try {
        (void)SyncOptions::from_json({{"rendezvous", "tcp"}});
        ADD_FAILURE() << "rendezvous 'tcp' was taken";
    } catch (const core::Error &e) {
        EXPECT_NE(std::string(e.what()).find("key 'rendezvous'"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("rendezvous: store | unique_id"), std::string::npos)
            << e.what();
    }
    o.rendezvous = "unique_id";
    try {
        client->sync(*new_weights, 1, o);
        ADD_FAILURE() << "an SGLang sync took rendezvous 'unique_id'";
    } catch (const core::Error &e) {
        EXPECT_NE(std::string(e.what()).find("rendezvous 'unique_id' is for vLLM's NCCL weight "
                                             "transfer"),
                  std::string::npos)
            << e.what();
    }
    EXPECT_EQ(served(), want_a);
}

TEST_F(ServeWeights, DiskSyncThroughTheClientWritesAStepFolderAndKeepsTheNewest) {
    SyncOptions o;
    o.mode = "disk";
    o.dir = dir / "broadcasts";
    o.keep = 1;
    EXPECT_FALSE(client->sync(*new_weights, 1, o).skipped);
    EXPECT_EQ(served(), want_b);
    EXPECT_TRUE(fs::exists(dir / "broadcasts/step_1/STABLE"));
    EXPECT_TRUE(fs::exists(dir / "broadcasts/step_1/rl_checksums.json"));
    EXPECT_FALSE(client->sync(*core::Policy::load(dir / "a"), 2, o).skipped);
    EXPECT_EQ(served(), want_a);
    EXPECT_FALSE(fs::exists(dir / "broadcasts/step_1"));
}

TEST_F(ServeWeights, ADistributedChecksumMismatchIsRefusedAfterTheBroadcast) {
    // A hand-driven trainer: announces one tensor with a wrong CRC-32C.
    const int port = rltest::free_tcp_port();
    core::dist::UpdateGroupOptions go;
    go.master_port = port;
    go.world_size = 2;
    auto init = std::async(std::launch::async, [&] {
        return post("/init_weights_update_group", {{"master_address", "127.0.0.1"},
                                                   {"master_port", port},
                                                   {"rank_offset", 1},
                                                   {"world_size", 2},
                                                   {"backend", "gloo"}});
    });
    core::dist::UpdateGroup group(go);
    ASSERT_EQ(init.get().status, 200);
    const auto [name, w] = new_weights->model().named_weights().front();
    std::vector<at::Tensor> t{w.detach().contiguous()};
    const uint32_t crc = tensor_crc32c(t[0]);
    auto reply = std::async(std::launch::async, [&] {
        return post("/update_weights_from_distributed", {{"names", {name}},
                                                         {"dtypes", {"float32"}},
                                                         {"shapes", {t[0].sizes().vec()}},
                                                         {"checksums", {crc ^ 1u}}});
    });
    group.broadcast(t);
    const HttpResponse r = reply.get();
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_NE(r.body.find("fails its checksum"), std::string::npos) << r.body;
    EXPECT_EQ(served(), want_a);
    EXPECT_EQ(post("/destroy_weights_update_group", json::object()).status, 200);
}

// The served model's final norm weight (a view of the parameter).
at::Tensor norm_weight(const std::shared_ptr<core::Policy> &policy) {
    for (const auto &[n, w] : policy->model().named_weights())
        if (n == "model.norm.weight") return w;
    return {};
}

// An /update_weights_from_tensor body setting model.norm.weight to `values`
// (float32 bytes, base64 as SGLang's named_tensors carry them).
json norm_update(const std::vector<float> &values) {
    std::string raw(reinterpret_cast<const char *>(values.data()), values.size() * sizeof(float));
    static const char *b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string enc;
    for (size_t i = 0; i < raw.size(); i += 3) {
        uint32_t v = static_cast<uint8_t>(raw[i]) << 16;
        if (i + 1 < raw.size()) v |= static_cast<uint8_t>(raw[i + 1]) << 8;
        if (i + 2 < raw.size()) v |= static_cast<uint8_t>(raw[i + 2]);
        enc += b64[(v >> 18) & 63];
        enc += b64[(v >> 12) & 63];
        enc += i + 1 < raw.size() ? b64[(v >> 6) & 63] : '=';
        enc += i + 2 < raw.size() ? b64[v & 63] : '=';
    }
    return {{"named_tensors",
             {{{"name", "model.norm.weight"},
               {"dtype", "float32"},
               {"shape", {values.size()}},
               {"data", enc}}}}};
}

TEST_F(ServeWeights, TensorsInTheRequestReplaceNamedWeights) {
    const at::Tensor norm = norm_weight(policy);
    ASSERT_TRUE(norm.defined());
    const HttpResponse r =
        post("/update_weights_from_tensor", norm_update(std::vector<float>(norm.numel(), 2.0f)));
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_TRUE(at::allclose(norm, at::full_like(norm, 2.0)));
}

TEST_F(ServeWeights, NonFiniteWeightsAreRefusedBeforeTheSwapAndTheOldWeightsKeepServing) {
    const at::Tensor norm = norm_weight(policy);
    ASSERT_TRUE(norm.defined());
    const at::Tensor before = norm.clone();
    const int64_t version = policy->version();
    for (float poison :
         {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
        std::vector<float> values(norm.numel(), 1.0f);
        values[3] = poison;
        const HttpResponse r = post("/update_weights_from_tensor", norm_update(values));
        EXPECT_EQ(r.status, 400) << r.body;
        EXPECT_NE(r.body.find("tensor 'model.norm.weight' holds 1 NaN or infinite value(s) (the "
                              "first at flat index 3)"),
                  std::string::npos)
            << r.body;
        EXPECT_TRUE(at::equal(norm, before));
        EXPECT_EQ(policy->version(), version);
    }
    EXPECT_EQ(served(), want_a);
}

TEST_F(ServeWeights, BadWeightRequestsAre400sNamingTheFieldAndTheServerKeepsServing) {
    struct Case {
        const char *path;
        json body;
        const char *says;
    } cases[] = {
        {"/update_weights_from_disk", {{"model_path", "/nonexistent"}}, "is not a folder"},
        {"/update_weights_from_disk", {{"model_path", "x"}, {"bogus", 1}}, "unknown field 'bogus'"},
        {"/update_weights_from_disk", json::object(), "'model_path' is required"},
        {"/update_weights_from_disk", {{"model_path", "x"}, {"load_format", "pt"}}, "load_format"},
        {"/update_weights_from_distributed",
         {{"names", {"x"}}, {"dtypes", {"float32"}}, {"shapes", {{1}}}},
         "no weight update group"},
        {"/update_weights_from_distributed", {{"names", {"x"}}}, "'dtypes' is required"},
        {"/update_weights_from_tensor", {{"serialized_named_tensors", {"abc"}}}, "pickles"},
        {"/update_weights_from_tensor",
         {{"named_tensors",
           {{{"name", "model.norm.weight"},
             {"dtype", "float32"},
             {"shape", {2}},
             {"data", "AAAA"}}}}},
         "bytes; shape and dtype need 8"},
        // vLLM's NCCL weight transfer engine (vLLM 0.33.0's bodies).
        {"/update_weights",
         {{"update_info", json::object()}},
         "call /init_weight_transfer_engine first"},
        {"/update_weights",
         {{"update_info", {{"names", {"x"}}, {"packed", true}}}},
         "update_info.packed is not a field of vLLM's NCCL engine"},
        // vLLM 0.33's list: one entry per worker by global rank; this server
        // is worker 0 and takes other ranks' entries only when they match.
        {"/update_weights", {{"update_info", json::array()}}, "update_info is an empty list"},
        {"/update_weights",
         {{"update_info",
           {{{"names", {"x"}}, {"dtype_names", {"float32"}}, {"shapes", {{1}}}},
            {{"names", {"x"}}, {"dtype_names", {"float32"}}, {"shapes", {{2}}}}}}},
         "update_info[1] differs from update_info[0] (shapes[0] is [2], update_info[0]'s [1]): "
         "a list holds one entry per worker"},
        {"/update_weights",
         {{"update_info",
           {{{"names", {"x"}}, {"dtype_names", {"float32"}}, {"shapes", {{1}}}},
            {{"names", {"y"}}, {"dtype_names", {"float32"}}, {"shapes", {{1}}}}}}},
         "update_info[1] differs from update_info[0] (names[0] is 'y', update_info[0]'s 'x')"},
        {"/update_weights",
         {{"update_info",
           {{{"names", {"x"}}, {"dtype_names", {"float32"}}, {"shapes", {{1}}}},
            {{"names", {"x"}}, {"dtype_names", {"bfloat16"}}, {"shapes", {{1}}}}}}},
         "(dtype_names[0] is 'bfloat16', update_info[0]'s 'float32')"},
        {"/update_weights",
         {{"update_info",
           {{{"names", {"x"}}, {"dtype_names", {"float32"}}, {"shapes", {{1}}}}, json::object()}}},
         "update_info[1] differs from update_info[0] (announces 0 tensors, update_info[0] 1)"},
        {"/update_weights",
         {{"update_info",
           {json::object(), {{"names", {1}}, {"dtype_names", {"float32"}}, {"shapes", {{1}}}}}}},
         "update_info[1].names[0] must be a string"},
        {"/update_weights",
         {{"update_info", {json::object(), {{"packed", true}}}}},
         "update_info[1].packed is not a field of vLLM's NCCL engine"},
        // Entries that match pass the checks (what every rank of a replicated
        // deployment receives): refused only for want of an engine.
        {"/update_weights",
         {{"update_info",
           {{{"names", {"x"}}, {"dtype_names", {"float32"}}, {"shapes", {{1}}}},
            {{"names", {"x"}}, {"dtype_names", {"float32"}}, {"shapes", {{1}}}}}}},
         "call /init_weight_transfer_engine first"},
        {"/update_weights",
         {{"update_info", {{"names", {"x"}}, {"dtype_names", json::array()}, {"shapes", {{1}}}}}},
         "names, dtype_names and shapes differ in length (1, 0, 1)"},
        {"/init_weight_transfer_engine", json::object(), "'init_info' is required"},
        {"/init_weight_transfer_engine",
         {{"init_info", {{"master_address", "127.0.0.1"}, {"rank_offset", 1}, {"world_size", 2}}}},
         "needs master_address and master_port"},
        {"/init_weight_transfer_engine",
         {{"init_info",
           {{"master_address", "127.0.0.1"},
            {"master_port", 1},
            {"rank_offset", 1},
            {"world_size", 2},
            {"backend", "nccl"}}}},
         "init_info.backend is not a field of vLLM's NCCL engine"},
        {"/init_weight_transfer_engine",
         {{"init_info",
           {{"master_address", "127.0.0.1"},
            {"master_port", 1},
            {"nccl_unique_id_b64", "AAAA"},
            {"rank_offset", 1},
            {"world_size", 2}}}},
         "not both"},
        {"/init_weight_transfer_engine",
         {{"init_info", {{"nccl_unique_id_b64", "AAAA"}, {"rank_offset", 1}, {"world_size", 2}}}},
         "the 128 bytes of an ncclUniqueId"},
        {"/init_weight_transfer_engine",
         {{"init_info",
           {{"master_address", "127.0.0.1"},
            {"master_port", 1},
            {"rank_offset", 0},
            {"world_size", 2}}}},
         "rank_offset 0 is outside 1..1"},
        {"/init_weight_transfer_engine",
         {{"init_info",
           {{"master_address", "127.0.0.1"},
            {"master_port", 1},
            {"rank_offset", 1},
            {"world_size", 2}}}},
         "vLLM's NCCL weight transfer needs the model on a CUDA device"},
        {"/start_weight_update", json::object(), "call /init_weight_transfer_engine first"},
        {"/finish_weight_update", {{"weight_version", "3"}}, "no weight update was started"},
        {"/init_broadcaster", json::object(), "prime-rl's NCCL broadcast"},
        {"/init_weights_update_group",
         {{"master_address", "127.0.0.1"},
          {"master_port", 1},
          {"rank_offset", 1},
          {"world_size", 2},
          {"backend", "nccl"}},
         "needs the model on a CUDA device"},
    };
    for (const auto &c : cases) {
        const HttpResponse r = post(c.path, c.body);
        EXPECT_EQ(r.status / 100, 4) << c.path << " " << c.body.dump() << " -> " << r.body;
        EXPECT_NE(r.body.find(c.says), std::string::npos)
            << c.path << " " << c.body.dump() << " -> " << r.body;
    }
    const HttpResponse bad = http_request(server->url(), "POST", "/update_weights_from_disk", "{");
    EXPECT_EQ(bad.status, 400) << bad.body;
    // Numbers past a double's range and nesting past 128 levels: 400, not 500.
    const HttpResponse big = http_request(server->url(), "POST", "/update_weights_from_tensor",
                                          R"({"serialized_named_tensors": [1e999]})");
    EXPECT_EQ(big.status, 400) << big.body;
    EXPECT_NE(big.body.find("a number is out of range"), std::string::npos) << big.body;
    const HttpResponse deep =
        http_request(server->url(), "POST", "/update_weights_from_disk",
                     R"({"model_path": )" + std::string(1000, '[') + std::string(1000, ']') + "}");
    EXPECT_EQ(deep.status, 400) << deep.body;
    EXPECT_NE(deep.body.find("nested deeper than 128 levels"), std::string::npos) << deep.body;
    EXPECT_EQ(served(), want_a);
}

} // namespace
} // namespace rl::serve
