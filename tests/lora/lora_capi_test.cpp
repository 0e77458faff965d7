// LoRA through the C API (abi/rl/train.h, ABI 0.5): adapters by name on a
// model, a trainer that creates and trains one, sampling with it, files, the
// merged export, and errors that name what is wrong.
#include "../train/train_util.hpp"

#include <nlohmann/json.hpp>

using namespace rl_train_test;
using nlohmann::json;

namespace {

std::vector<float> forward_logprobs(rl_trainer_t *t, Batch &b) {
    Result r;
    EXPECT_EQ(rl_trainer_forward(t, b.view(), nullptr, r.out()), RL_OK) << rl_last_error();
    return r.tensor<float>("logprobs");
}

std::string error_of(rl_status_t st) {
    return st == RL_OK ? std::string("(no error)") : std::string(rl_last_error());
}

} // namespace

TEST(LoraCapi, TrainerCreatesTrainsAndSamplesWithAnAdapter) {
    TempDir tmp("lora");
    ModelPtr m = load_model();
    TrainerPtr t = make_trainer(
        m.get(), R"({"learning_rate": 0.01, "adapter": "s1", "lora": {"rank": 4, "alpha": 8}})");
    Result info;
    RL_ASSERT_OK(rl_adapter_info(m.get(), nullptr, info.out()));
    EXPECT_EQ(json::parse(info.text("adapters")), json::array({"s1"}));
    RL_ASSERT_OK(rl_adapter_info(m.get(), "s1", info.out()));
    const json i = json::parse(info.text("info"));
    EXPECT_EQ(i["rank"], 4);
    EXPECT_EQ(i["scale"], 2.0);
    EXPECT_EQ(i["target_modules"], json::array({"all-linear"}));
    EXPECT_EQ(i["version"], 0);

    Batch b;
    b.add(encode(m.get(), "lora over the c api"));
    const auto before = forward_logprobs(t.get(), b);
    InstancePtr ce = make_loss("causallm_loss");
    for (int k = 0; k < 3; ++k) {
        Result r;
        RL_ASSERT_OK(rl_trainer_forward_backward(t.get(), b.view(), ce.get(), r.out()));
        RL_ASSERT_OK(rl_trainer_optim_step(t.get(), nullptr, r.out()));
        EXPECT_EQ(r.scalar("policy_version"), k + 1); // the adapter's version
    }
    const auto after = forward_logprobs(t.get(), b);
    EXPECT_GT(max_abs_diff(before, after), 1e-3);
    Result mi;
    RL_ASSERT_OK(rl_model_info(m.get(), mi.out()));
    EXPECT_EQ(json::parse(mi.text("info"))["policy_version"], 0); // the base did not move

    // The engine samples with the adapter when asked, with its version.
    EnginePtr e = make_engine(m.get());
    const std::vector<int64_t> prompt = encode(m.get(), "lora");
    const int64_t n_prompt = static_cast<int64_t>(prompt.size()), cu_shape = 2;
    const std::vector<int64_t> cu{0, n_prompt};
    const rl_tensor_view_t pv = view_of(prompt.data(), &n_prompt, kI64);
    const rl_tensor_view_t cv = view_of(cu.data(), &cu_shape, kI64);
    Result g;
    RL_ASSERT_OK(rl_engine_generate(e.get(), &pv, &cv,
                                    R"({"adapter": "s1", "max_tokens": 6, "seed": 1})", g.out()));
    EXPECT_EQ(g.scalar("policy_version"), 3);
    EXPECT_EQ(error_of(rl_engine_generate(e.get(), &pv, &cv, R"({"adapter": "nope"})", g.out())),
              "no LoRA adapter 'nope' on this model; adapters: s1");

    // Files: save, load under another name (same logprobs), merged export (same logprobs).
    RL_ASSERT_OK(rl_adapter_save(m.get(), "s1", tmp.sub("s1").c_str()));
    RL_ASSERT_OK(rl_adapter_load(m.get(), "copy", tmp.sub("s1").c_str()));
    TrainerPtr tc = make_trainer(m.get(), R"({"adapter": "copy"})");
    EXPECT_EQ(forward_logprobs(tc.get(), b), after);
    RL_ASSERT_OK(rl_adapter_export_merged(m.get(), "s1", tmp.sub("merged").c_str()));
    ModelPtr merged = load_model(tmp.sub("merged"));
    TrainerPtr tm = make_trainer(merged.get(), "{}");
    EXPECT_LT(max_abs_diff(forward_logprobs(tm.get(), b), after), 1e-5);

    RL_ASSERT_OK(rl_adapter_remove(m.get(), "copy"));
    EXPECT_EQ(rl_adapter_remove(m.get(), "copy"), RL_ERR_NOT_FOUND);
}

TEST(LoraCapi, BadRequestsNameTheProblem) {
    ModelPtr m = load_model();
    rl_trainer_t *t = nullptr;
    EXPECT_NE(error_of(rl_trainer_create(m.get(), R"({"adapter": "missing"})", &t))
                  .find("no LoRA adapter 'missing'"),
              std::string::npos);
    EXPECT_NE(error_of(rl_trainer_create(m.get(), R"({"lora": {"rank": -1}})", &t))
                  .find("lora.rank"),
              std::string::npos);
    // A trainer that fails on its own keys leaves no adapter behind.
    EXPECT_NE(error_of(rl_trainer_create(m.get(), R"({"lora": {}, "learnig_rate": 1})", &t))
                  .find("learnig_rate"),
              std::string::npos);
    Result info;
    RL_ASSERT_OK(rl_adapter_info(m.get(), nullptr, info.out()));
    EXPECT_EQ(info.text("adapters"), "[]");
    RL_ASSERT_OK(rl_adapter_create(m.get(), "a", R"({"target_modules": ["q_proj", "v_proj"]})"));
    EXPECT_NE(error_of(rl_adapter_create(m.get(), "a", nullptr)).find("'a' exists already"),
              std::string::npos);
    EXPECT_NE(error_of(rl_adapter_create(m.get(), "b", R"({"target_modules": ["qproj"]})"))
                  .find("unknown module 'qproj'"),
              std::string::npos);
    EXPECT_NE(error_of(rl_adapter_load(m.get(), "c", "/nonexistent/adapter"))
                  .find("has no adapter_config.json"),
              std::string::npos);
    EXPECT_EQ(rl_adapter_info(m.get(), "zzz", info.out()), RL_ERR_NOT_FOUND);
}
