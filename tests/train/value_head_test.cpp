// The value head (model.value_head): the trainer computes "values" from the
// policy's trunk, value_loss trains it through the loss contract, and model
// folders and checkpoints keep it. Through the C API, as an embedder would.
#include "train_util.hpp"

#include <nlohmann/json.hpp>

#include <filesystem>

namespace rl_train_test {
namespace {

using json = nlohmann::json;

ModelPtr load_with_head(const std::string &dir, uint64_t seed = 7) {
    rl_model_t *m = nullptr;
    const std::string opts =
        R"({"threads": 1, "value_head": true, "value_head_seed": )" + std::to_string(seed) + "}";
    if (rl_model_load(dir.c_str(), opts.c_str(), &m) != RL_OK)
        ADD_FAILURE() << "load model with a value head: " << rl_last_error();
    return ModelPtr(m);
}

// Sequences with a prompt (mask 0) and a completion (mask 1), and returns
// the critic should learn: one target per sequence on its completion.
Batch critic_batch() {
    Batch b = random_batch(11, 4, 6, 10);
    std::vector<float> returns;
    for (int64_t s = 0; s < b.n_seqs(); ++s) {
        const float target = s % 2 == 0 ? 1.0f : -0.5f;
        for (int64_t t = b.cu[s]; t < b.cu[s + 1]; ++t) returns.push_back(target);
    }
    b.floats["returns"] = returns;
    b.floats.erase("advantages");
    return b;
}

std::vector<float> values_of(rl_trainer_t *t, Batch &b) {
    Result r;
    EXPECT_EQ(rl_trainer_forward(t, b.view(), nullptr, r.out()), RL_OK) << rl_last_error();
    return r.tensor<float>("values");
}

// Mean squared error of the values against the returns on completion tokens.
double completion_mse(const std::vector<float> &v, const Batch &b) {
    const auto &mask = b.floats.at("loss_mask");
    const auto &ret = b.floats.at("returns");
    double err = 0;
    int64_t n = 0;
    for (size_t i = 0; i < v.size(); ++i)
        if (mask[i] != 0) err += (v[i] - ret[i]) * (v[i] - ret[i]), ++n;
    return n ? err / static_cast<double>(n) : 0.0;
}

TEST(ValueHead, ForwardGivesOneValuePerTokenZeroAtSequenceStarts) {
    ModelPtr m = load_with_head(tiny_model_dir());
    TrainerPtr t = make_trainer(m.get(), R"({"learning_rate": 0.003})");
    Batch b = critic_batch();
    const std::vector<float> v = values_of(t.get(), b);
    ASSERT_EQ(v.size(), b.ids.size());
    for (int64_t s = 0; s < b.n_seqs(); ++s) EXPECT_EQ(v[static_cast<size_t>(b.cu[s])], 0.0f);
    bool nonzero = false;
    for (float x : v) nonzero = nonzero || x != 0.0f;
    EXPECT_TRUE(nonzero);

    Result info;
    RL_ASSERT_OK(rl_model_info(m.get(), info.out()));
    EXPECT_TRUE(json::parse(info.text("info"))["value_head"].get<bool>());
    // A model without one gives no values.
    ModelPtr plain = load_model();
    TrainerPtr tp = make_trainer(plain.get(), "{}");
    Result r;
    RL_ASSERT_OK(rl_trainer_forward(tp.get(), b.view(), nullptr, r.out()));
    EXPECT_FALSE(r.has_tensor("values"));
}

TEST(ValueHead, ValueLossFallsOnAFixedBatch) {
    ModelPtr m = load_with_head(tiny_model_dir());
    TrainerPtr t = make_trainer(m.get(), R"({"learning_rate": 0.003})");
    InstancePtr vl = make_loss("value_loss");
    Batch b = critic_batch();
    const double before = completion_mse(values_of(t.get(), b), b);
    std::vector<double> losses;
    for (int i = 0; i < 15; ++i) {
        Result r;
        RL_ASSERT_OK(rl_trainer_forward_backward(t.get(), b.view(), vl.get(), r.out()));
        losses.push_back(r.scalar("loss"));
        Result o;
        RL_ASSERT_OK(rl_trainer_optim_step(t.get(), nullptr, o.out()));
    }
    EXPECT_LT(losses.back(), 0.5 * losses.front())
        << "first " << losses.front() << ", last " << losses.back();
    // The completion tokens moved toward their targets.
    EXPECT_LT(completion_mse(values_of(t.get(), b), b), before);
}

TEST(ValueHead, BatchValuesAreRefusedWhenTheHeadComputesThem) {
    ModelPtr m = load_with_head(tiny_model_dir());
    TrainerPtr t = make_trainer(m.get(), "{}");
    InstancePtr vl = make_loss("value_loss");
    Batch b = critic_batch();
    b.floats["values"] = std::vector<float>(b.ids.size(), 0.0f);
    Result r;
    EXPECT_EQ(rl_trainer_forward_backward(t.get(), b.view(), vl.get(), r.out()),
              RL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(rl_last_error()).find("old_values"), std::string::npos)
        << rl_last_error();
    // Without a head the batch's values are data, as before.
    ModelPtr plain = load_model();
    TrainerPtr tp = make_trainer(plain.get(), "{}");
    RL_EXPECT_OK(rl_trainer_forward_backward(tp.get(), b.view(), vl.get(), r.out()));
}

TEST(ValueHead, CheckpointAndModelFolderKeepTheHead) {
    TempDir dir("value-head");
    ModelPtr m = load_with_head(tiny_model_dir(), 7);
    TrainerPtr t = make_trainer(m.get(), R"({"learning_rate": 0.003})");
    InstancePtr vl = make_loss("value_loss");
    Batch b = critic_batch();
    for (int i = 0; i < 3; ++i) {
        Result r, o;
        RL_ASSERT_OK(rl_trainer_forward_backward(t.get(), b.view(), vl.get(), r.out()));
        RL_ASSERT_OK(rl_trainer_optim_step(t.get(), nullptr, o.out()));
    }
    const std::vector<float> trained = values_of(t.get(), b);
    Result saved;
    RL_ASSERT_OK(
        rl_trainer_save_checkpoint(t.get(), dir.sub("ckpt").c_str(), nullptr, saved.out()));
    EXPECT_TRUE(std::filesystem::exists(saved.text("path") + "/model/value_head.safetensors"));
    RL_ASSERT_OK(rl_model_save(m.get(), dir.sub("saved").c_str()));
    EXPECT_TRUE(std::filesystem::exists(dir.sub("saved") + "/value_head.safetensors"));

    // A fresh head (another seed) restored from the checkpoint: same values,
    // and the next step equals the original's (optimizer state kept).
    ModelPtr m2 = load_with_head(tiny_model_dir(), 99);
    TrainerPtr t2 = make_trainer(m2.get(), R"({"learning_rate": 0.003})");
    EXPECT_GT(max_abs_diff(values_of(t2.get(), b), trained), 1e-3);
    Result loaded;
    RL_ASSERT_OK(rl_trainer_load_checkpoint(t2.get(), dir.sub("ckpt").c_str(), loaded.out()));
    EXPECT_EQ(max_abs_diff(values_of(t2.get(), b), trained), 0.0);
    for (rl_trainer_t *tr : {t.get(), t2.get()}) {
        Result r, o;
        RL_ASSERT_OK(rl_trainer_forward_backward(tr, b.view(), vl.get(), r.out()));
        RL_ASSERT_OK(rl_trainer_optim_step(tr, nullptr, o.out()));
    }
    EXPECT_EQ(max_abs_diff(values_of(t2.get(), b), values_of(t.get(), b)), 0.0);

    // The saved folder loads with its head (the seed no longer matters).
    ModelPtr m3 = load_with_head(dir.sub("saved"), 12345);
    TrainerPtr t3 = make_trainer(m3.get(), "{}");
    EXPECT_EQ(max_abs_diff(values_of(t3.get(), b), trained), 0.0);

    // A checkpoint without a head cannot restore one.
    ModelPtr plain = load_model();
    TrainerPtr tp = make_trainer(plain.get(), "{}");
    Batch pb = random_batch(5, 2, 5, 8);
    pb.floats.erase("advantages");
    Result r, o, s;
    RL_ASSERT_OK(
        rl_trainer_forward_backward(tp.get(), pb.view(), make_loss("per_token_ce").get(), r.out()));
    RL_ASSERT_OK(rl_trainer_optim_step(tp.get(), nullptr, o.out()));
    RL_ASSERT_OK(rl_trainer_save_checkpoint(tp.get(), dir.sub("plain").c_str(), nullptr, s.out()));
    Result l;
    EXPECT_EQ(rl_trainer_load_checkpoint(t3.get(), dir.sub("plain").c_str(), l.out()),
              RL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(rl_last_error()).find("value_head.safetensors"), std::string::npos)
        << rl_last_error();
}

TEST(ValueHead, BadOptionsAreRefusedByName) {
    rl_model_t *m = nullptr;
    EXPECT_NE(rl_model_load(tiny_model_dir().c_str(), R"({"value_head": 1})", &m), RL_OK);
    EXPECT_NE(std::string(rl_last_error()).find("value_head"), std::string::npos);
    EXPECT_NE(rl_model_load(tiny_model_dir().c_str(), R"({"value_head_seed": -1})", &m), RL_OK);
    EXPECT_NE(std::string(rl_last_error()).find("value_head_seed"), std::string::npos);
}

} // namespace
} // namespace rl_train_test
