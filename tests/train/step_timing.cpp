// Measures one GRPO-shaped step on the tiny model through the C API: generate
// 64 samples (8 prompts x 8) of up to 20 tokens, then forward_backward with
// policy_loss and optim_step. Not a test (it asserts nothing): a measurement
// tool for docs/trainer.md.
//
// usage: train_step_timing PLUGIN_DIR [STEPS] [THREADS]
#include "plugin_runtime.hpp"

#include <rl_api.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

namespace {

[[noreturn]] void die(const char *what) {
    std::fprintf(stderr, "%s: %s\n", what, rl_last_error());
    std::exit(1);
}

double now() {
    using namespace std::chrono;
    return duration<double>(steady_clock::now().time_since_epoch()).count();
}

rl_tensor_view_t view(const void *data, const int64_t *shape, rl_dtype_t dt) {
    return rl_tensor_view_t{const_cast<void *>(data),
                            {RL_DEVICE_CPU, 0},
                            1,
                            dt,
                            const_cast<int64_t *>(shape),
                            nullptr,
                            0};
}

} // namespace

int main(int argc, char **argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s PLUGIN_DIR [STEPS] [THREADS]\n", argv[0]);
        return 2;
    }
    const int steps = argc > 2 ? std::atoi(argv[2]) : 5;
    const std::string threads = argc > 3 ? argv[3] : "0";
    const std::string dir =
        (std::filesystem::temp_directory_path() / "rl-step-timing-model").string();
    if (rl_model_init_preset("tiny", dir.c_str(), 1) != RL_OK) die("init");
    rl_runtime_t *rt = rl_train_test::plugin_runtime(argv[1]);
    if (!rt) die("runtime");
    rl_model_t *model = nullptr;
    rl_trainer_t *trainer = nullptr;
    rl_engine_t *engine = nullptr;
    rl_instance_t *loss = nullptr;
    const std::string opts = "{\"threads\": " + threads + "}";
    if (rl_model_load(dir.c_str(), opts.c_str(), &model) != RL_OK) die("load");
    if (rl_trainer_create(model, "{\"learning_rate\": 1e-4}", &trainer) != RL_OK) die("trainer");
    if (rl_engine_create(model, nullptr, &engine) != RL_OK) die("engine");
    if (rl_instance_create(rt, "loss", "policy_loss", "{}", &loss) != RL_OK) die("loss");

    // 8 prompts of ~24 bytes.
    std::vector<int64_t> prompt_ids, prompt_cu = {0};
    for (int p = 0; p < 8; ++p) {
        const std::string text = "Reverse the text: word" + std::to_string(p) + "\n";
        for (unsigned char c : text) prompt_ids.push_back(c);
        prompt_cu.push_back(static_cast<int64_t>(prompt_ids.size()));
    }
    const int64_t n_ids = static_cast<int64_t>(prompt_ids.size()), n_cu = 9;
    const rl_dtype_t i64{RL_DTYPE_INT, 64, 1}, f32{RL_DTYPE_FLOAT, 32, 1};
    const rl_tensor_view_t pv = view(prompt_ids.data(), &n_ids, i64),
                           cv = view(prompt_cu.data(), &n_cu, i64);

    for (int step = 0; step < steps; ++step) {
        const double t0 = now();
        rl_result_t *g = nullptr;
        const std::string params =
            "{\"n\": 8, \"max_tokens\": 20, \"stop_token_ids\": [], \"seed\": " +
            std::to_string(step) + "}";
        if (rl_engine_generate(engine, &pv, &cv, params.c_str(), &g) != RL_OK) die("generate");
        const double t1 = now();
        rl_tensor_view_t toks{}, lps{}, cus{}, pidx{};
        rl_result_tensor(g, "token_ids", &toks);
        rl_result_tensor(g, "logprobs", &lps);
        rl_result_tensor(g, "cu_seqlens", &cus);
        rl_result_tensor(g, "prompt_index", &pidx);
        const int64_t *tk = static_cast<const int64_t *>(toks.data);
        const float *lp = static_cast<const float *>(lps.data);
        const int64_t *cu = static_cast<const int64_t *>(cus.data);
        const int64_t *pi = static_cast<const int64_t *>(pidx.data);
        std::vector<int64_t> ids, bcu = {0};
        std::vector<float> old, mask, adv;
        for (int64_t s = 0; s < cus.shape[0] - 1; ++s) {
            const int64_t p = pi[s];
            for (int64_t t = prompt_cu[p]; t < prompt_cu[p + 1]; ++t) {
                ids.push_back(prompt_ids[t]);
                old.push_back(0);
                mask.push_back(0);
                adv.push_back(0);
            }
            for (int64_t t = cu[s]; t < cu[s + 1]; ++t) {
                ids.push_back(tk[t]);
                old.push_back(lp[t]);
                mask.push_back(1);
                adv.push_back(s % 2 ? 1.0f : -1.0f);
            }
            bcu.push_back(static_cast<int64_t>(ids.size()));
        }
        const int64_t nt = static_cast<int64_t>(ids.size()), nc = static_cast<int64_t>(bcu.size());
        rl_tensor_arg_t args[3] = {{"old_logprobs", view(old.data(), &nt, f32)},
                                   {"loss_mask", view(mask.data(), &nt, f32)},
                                   {"advantages", view(adv.data(), &nt, f32)}};
        rl_batch_t batch{};
        batch.struct_size = sizeof(rl_batch_t);
        batch.input_ids = view(ids.data(), &nt, i64);
        batch.cu_seqlens = view(bcu.data(), &nc, i64);
        batch.tensors = rl_tensor_list_t{args, 3};
        rl_result_t *fb = nullptr, *os = nullptr;
        if (rl_trainer_forward_backward(trainer, &batch, loss, &fb) != RL_OK)
            die("forward_backward");
        const double t2 = now();
        if (rl_trainer_optim_step(trainer, nullptr, &os) != RL_OK) die("optim_step");
        rl_result_t *sy = nullptr;
        if (rl_engine_sync_weights(engine, &sy) != RL_OK) die("sync");
        const double t3 = now();
        std::printf(
            "step %d: generate %.3f s (%lld tokens), forward_backward %.3f s (%lld tokens), "
            "optim_step+sync %.3f s, total %.3f s\n",
            step, t1 - t0, static_cast<long long>(toks.shape[0]), t2 - t1,
            static_cast<long long>(nt), t3 - t2, t3 - t0);
        rl_result_destroy(g);
        rl_result_destroy(fb);
        rl_result_destroy(os);
        rl_result_destroy(sy);
    }
    rl_instance_destroy(loss);
    rl_engine_destroy(engine);
    rl_trainer_destroy(trainer);
    rl_model_destroy(model);
    rl_runtime_destroy(rt);
    return 0;
}
