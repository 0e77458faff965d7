// Weight sync over transport plugins (abi/rl/train.h rl_weights_send /
// rl_weights_recv, docs/transports.md): trained weights reach an inference
// model exactly; stale versions are skipped; corrupted or foreign weight sets
// are refused and the model keeps the version it had.
#include "free_port.hpp"
#include "train_util.hpp"

#include <nlohmann/json.hpp>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <limits>

using namespace rl_train_test;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

InstancePtr make_transport(const char *name, const json &params) {
    rl_instance_t *i = nullptr;
    const std::string p = params.dump();
    if (rl_instance_create(runtime(), "transport", name, p.c_str(), &i) != RL_OK)
        ADD_FAILURE() << "create transport " << name << ": " << rl_last_error();
    return InstancePtr(i);
}

// The logprobs a model gives a fixed batch.
std::vector<float> logprobs_of(rl_model_t *m) {
    TrainerPtr t = make_trainer(m, "{}");
    Batch b = random_batch(7, 3, 6, 12);
    Result r;
    EXPECT_EQ(rl_trainer_forward(t.get(), b.view(), nullptr, r.out()), RL_OK) << rl_last_error();
    return r.tensor<float>("logprobs");
}

// One optimizer step on `m`, so its weights differ from the tiny model's.
void train_one_step(rl_model_t *m) {
    TrainerPtr t = make_trainer(m, R"({"learning_rate": 0.05})");
    InstancePtr ce = make_loss("causallm_loss");
    Batch b;
    for (const char *text : {"weights travel", "from the trainer", "to the rollout workers"})
        b.add(encode(m, text));
    Result r, o;
    ASSERT_EQ(rl_trainer_forward_backward(t.get(), b.view(), ce.get(), r.out()), RL_OK)
        << rl_last_error();
    ASSERT_EQ(rl_trainer_optim_step(t.get(), nullptr, o.out()), RL_OK) << rl_last_error();
}

int64_t policy_version(rl_model_t *m) {
    Result info;
    EXPECT_EQ(rl_model_info(m, info.out()), RL_OK);
    return json::parse(info.text("info")).at("policy_version").get<int64_t>();
}

struct Ends {
    InstancePtr tx, rx;
};

Ends filesystem_ends(const std::string &dir) {
    return {make_transport("filesystem", {{"dir", dir}, {"channel", "broadcasts"}}),
            make_transport(
                "filesystem",
                {{"dir", dir}, {"channel", "broadcasts"}, {"mode", "latest"}, {"poll_ms", 5}})};
}

Ends zmq_ends() {
    const int port = rltest::free_tcp_port();
    Ends e;
    e.rx = make_transport("zmq", {{"role", "pull"}, {"port", port}});
    e.tx = make_transport("zmq", {{"role", "push"}, {"port", port}, {"timeout_ms", 5000}});
    return e;
}

} // namespace

class WeightSync : public ::testing::TestWithParam<std::string> {
protected:
    Ends ends() { return GetParam() == "filesystem" ? filesystem_ends(dir_.path()) : zmq_ends(); }
    TempDir dir_{"weights"};
};

TEST_P(WeightSync, TrainedWeightsReachTheInferenceModelExactly) {
    ModelPtr trainer_model = load_model();
    ModelPtr worker = load_model();
    train_one_step(trainer_model.get());
    const auto want = logprobs_of(trainer_model.get());
    ASSERT_GT(max_abs_diff(want, logprobs_of(worker.get())), 1e-4) << "the step changed nothing";

    Ends e = ends();
    Result sent, got;
    RL_ASSERT_OK(rl_weights_send(trainer_model.get(), e.tx.get(), 1, nullptr, sent.out()));
    EXPECT_GT(sent.metric("sync/bytes"), 1e6);
    EXPECT_EQ(sent.metric("sync/version"), 1.0);
    RL_ASSERT_OK(rl_weights_recv(worker.get(), e.rx.get(), 20000, nullptr, got.out()));
    EXPECT_EQ(got.scalar("version"), 1.0);
    EXPECT_EQ(got.metric("sync/version"), 1.0);
    EXPECT_EQ(got.metric("sync/bytes"), sent.metric("sync/bytes"));
    EXPECT_GE(got.metric("sync/seconds"), 0.0);
    EXPECT_EQ(policy_version(worker.get()), 1);
    EXPECT_EQ(logprobs_of(worker.get()), want);

    // The co-located engine of the worker samples from the new weights.
    EnginePtr eng = make_engine(worker.get());
    Result s;
    RL_ASSERT_OK(rl_engine_sync_weights(eng.get(), s.out()));
    EXPECT_EQ(s.scalar("policy_version"), 1.0);
}

TEST_P(WeightSync, VersionsNotNewerThanTheOneInUseAreSkipped) {
    ModelPtr src = load_model();
    ModelPtr worker = load_model();
    Ends e = ends();
    Result a, b, got;
    RL_ASSERT_OK(rl_weights_send(src.get(), e.tx.get(), 2, nullptr, a.out()));
    RL_ASSERT_OK(rl_weights_recv(worker.get(), e.rx.get(), 20000, nullptr, got.out()));
    EXPECT_EQ(got.scalar("version"), 2.0);
    train_one_step(src.get());
    RL_ASSERT_OK(rl_weights_send(src.get(), e.tx.get(), 2, nullptr, b.out())); // same version
    const auto before = logprobs_of(worker.get());
    Result none;
    EXPECT_EQ(rl_weights_recv(worker.get(), e.rx.get(), 300, nullptr, none.out()), RL_ERR_TIMEOUT);
    EXPECT_NE(std::string(rl_last_error()).find("in use: version 2"), std::string::npos)
        << rl_last_error();
    EXPECT_EQ(logprobs_of(worker.get()), before);
}

// Sends `header` (with `tensors`) through `e`; the worker's recv of it must be
// refused as an invalid argument: the error message.
std::string refused_recv(rl_model_t *worker, Ends &e, const std::string &header,
                         const rl_tensor_list_t *tensors) {
    EXPECT_EQ(
        rl_transport_send(e.tx.get(), rl_string_view_t{header.data(), header.size()}, tensors),
        RL_OK)
        << rl_last_error();
    Result r;
    EXPECT_EQ(rl_weights_recv(worker, e.rx.get(), 20000, nullptr, r.out()), RL_ERR_INVALID_ARG);
    return rl_last_error();
}

TEST_P(WeightSync, AMessageThatIsNotAWeightSetIsRefusedNamingIt) {
    ModelPtr worker = load_model();
    Ends e = ends();
    const std::string err =
        refused_recv(worker.get(), e, R"({"kind": "batch", "step": 0})", nullptr);
    EXPECT_NE(err.find("not a weight set"), std::string::npos) << err;
    EXPECT_EQ(policy_version(worker.get()), 0);
}

TEST_P(WeightSync, WeightsOfAnotherModelAreRefusedAndNothingChanges) {
    ModelPtr worker = load_model();
    const auto before = logprobs_of(worker.get());
    Ends e = ends();
    std::vector<float> w(16, 0.5f);
    int64_t shape[2] = {4, 4};
    rl_tensor_arg_t arg{};
    arg.name = "model.norm.weight";
    arg.view = view_of(w.data(), shape, rl_dtype_t{RL_DTYPE_FLOAT, 32, 1});
    arg.view.ndim = 2;
    const rl_tensor_list_t list{&arg, 1};
    const std::string err =
        refused_recv(worker.get(), e, R"({"kind": "rl.weights", "version": 5, "step": 5})", &list);
    EXPECT_NE(err.find("have 1 tensors"), std::string::npos) << err;
    EXPECT_EQ(policy_version(worker.get()), 0);
    EXPECT_EQ(logprobs_of(worker.get()), before);
}

INSTANTIATE_TEST_SUITE_P(Transports, WeightSync,
                         ::testing::Values(std::string("filesystem"), std::string("zmq")),
                         [](const auto &info) { return info.param; });

TEST(WeightSyncFilesystem, CorruptedWeightsAreRefusedAndTheNextVersionIsTaken) {
    TempDir dir("weights-corrupt");
    ModelPtr src = load_model();
    ModelPtr worker = load_model();
    const auto original = logprobs_of(worker.get());
    train_one_step(src.get());
    Ends e = filesystem_ends(dir.path());
    Result a;
    RL_ASSERT_OK(rl_weights_send(src.get(), e.tx.get(), 1, nullptr, a.out()));
    // Bit rot on the shared disk.
    const fs::path bin = fs::path(dir.path()) / "broadcasts" / "step_1" / "tensors.bin";
    {
        std::fstream f(bin, std::ios::in | std::ios::out | std::ios::binary);
        f.seekg(1000);
        char c = 0;
        f.read(&c, 1);
        c = static_cast<char>(c ^ 0x10);
        f.seekp(1000);
        f.write(&c, 1);
    }
    Result r;
    EXPECT_EQ(rl_weights_recv(worker.get(), e.rx.get(), 2000, R"({"retries": 0})", r.out()),
              RL_ERR_INVALID_ARG);
    const std::string err = rl_last_error();
    EXPECT_NE(err.find("checksum mismatch"), std::string::npos) << err;
    EXPECT_NE(err.find("keeps the weights it was loaded with"), std::string::npos) << err;
    EXPECT_EQ(logprobs_of(worker.get()), original) << "a refused weight set changed the model";
    // The trainer's next version arrives intact and is taken.
    Result b, got;
    RL_ASSERT_OK(rl_weights_send(src.get(), e.tx.get(), 2, nullptr, b.out()));
    RL_ASSERT_OK(rl_weights_recv(worker.get(), e.rx.get(), 20000, nullptr, got.out()));
    EXPECT_EQ(got.scalar("version"), 2.0);
    EXPECT_EQ(logprobs_of(worker.get()), logprobs_of(src.get()));
}

// A sender whose weights went NaN (diverged training, a bad checkpoint): the
// set arrives intact, checksums and all, and is refused before the swap.
TEST_P(WeightSync, NonFiniteWeightsAreRefusedAndTheModelKeepsItsVersion) {
    // A copy of the tiny model with one NaN in model.norm.weight.
    TempDir poisoned("weights-nan");
    fs::copy(tiny_model_dir(), poisoned.path(), fs::copy_options::recursive);
    const fs::path file = fs::path(poisoned.path()) / "model.safetensors";
    {
        std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
        uint64_t header_len = 0;
        f.read(reinterpret_cast<char *>(&header_len), 8);
        std::string header(header_len, '\0');
        f.read(header.data(), static_cast<std::streamsize>(header_len));
        const json h = json::parse(header);
        ASSERT_EQ(h.at("model.norm.weight").at("dtype"), "F32");
        const uint64_t begin = h.at("model.norm.weight").at("data_offsets")[0].get<uint64_t>();
        const float nan = std::numeric_limits<float>::quiet_NaN();
        f.seekp(static_cast<std::streamoff>(8 + header_len + begin + 2 * sizeof(float)));
        f.write(reinterpret_cast<const char *>(&nan), sizeof nan);
    }
    ModelPtr src = load_model(poisoned.path());
    ModelPtr worker = load_model();
    const auto before = logprobs_of(worker.get());
    Ends e = ends();
    Result sent, r;
    RL_ASSERT_OK(rl_weights_send(src.get(), e.tx.get(), 4, nullptr, sent.out()));
    EXPECT_EQ(rl_weights_recv(worker.get(), e.rx.get(), 20000, nullptr, r.out()), RL_ERR_NUMERIC);
    const std::string err = rl_last_error();
    EXPECT_NE(err.find("tensor 'model.norm.weight' holds 1 NaN or infinite value(s) (the first "
                       "at flat index 2)"),
              std::string::npos)
        << err;
    EXPECT_EQ(policy_version(worker.get()), 0);
    EXPECT_EQ(logprobs_of(worker.get()), before);
}

// A trainer restarted from its checkpoint broadcasts an older version: the
// handshake skips it, unless the worker says newer_than (then it is taken).
TEST(WeightSyncOptions, NewerThanTakesTheOlderVersionOfARestartedTrainer) {
    ModelPtr src = load_model();
    ModelPtr worker = load_model();
    Ends e = zmq_ends();
    Result a, got;
    RL_ASSERT_OK(rl_weights_send(src.get(), e.tx.get(), 5, nullptr, a.out()));
    RL_ASSERT_OK(rl_weights_recv(worker.get(), e.rx.get(), 20000, nullptr, got.out()));
    EXPECT_EQ(got.scalar("version"), 5.0);
    Result b, skipped;
    RL_ASSERT_OK(rl_weights_send(src.get(), e.tx.get(), 3, nullptr, b.out()));
    EXPECT_EQ(rl_weights_recv(worker.get(), e.rx.get(), 1000, nullptr, skipped.out()),
              RL_ERR_TIMEOUT)
        << "version 3 is not newer than 5";
    Result c, taken;
    RL_ASSERT_OK(rl_weights_send(src.get(), e.tx.get(), 3, nullptr, c.out()));
    RL_ASSERT_OK(
        rl_weights_recv(worker.get(), e.rx.get(), 20000, R"({"newer_than": 2})", taken.out()));
    EXPECT_EQ(taken.scalar("version"), 3.0);
    EXPECT_EQ(policy_version(worker.get()), 3);
}

TEST(WeightSyncOptions, BadOptionsAreNamed) {
    ModelPtr m = load_model();
    TempDir dir("weights-opts");
    Ends e = filesystem_ends(dir.path());
    Result r;
    EXPECT_EQ(rl_weights_send(m.get(), e.tx.get(), 0, R"({"dtype": "fp8"})", r.out()),
              RL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(rl_last_error()).find("'dtype'"), std::string::npos);
    EXPECT_EQ(rl_weights_send(m.get(), e.tx.get(), -1, nullptr, r.out()), RL_ERR_INVALID_ARG);
    EXPECT_EQ(rl_weights_recv(m.get(), e.rx.get(), 10, R"({"retry": 1})", r.out()),
              RL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(rl_last_error()).find("'retry'"), std::string::npos);
}
