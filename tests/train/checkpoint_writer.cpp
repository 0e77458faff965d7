// Helper process of CheckpointTest.KilledWhileSaving...: trains the tiny model
// one deterministic SFT step at a time and checkpoints after every step,
// resuming from the newest complete checkpoint first, until it is killed or
// reaches the step limit. Prints "saving N" before and "saved N" after each
// checkpoint.
//
// usage: train_checkpoint_writer MODEL_DIR CHECKPOINT_DIR PLUGIN_DIR MAX_STEPS
#include "plugin_runtime.hpp"

#include <rl_api.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

int fail(const char *what) {
    std::fprintf(stderr, "checkpoint writer: %s: %s\n", what, rl_last_error());
    return 1;
}

} // namespace

int main(int argc, char **argv) {
    if (argc != 5) {
        std::fprintf(stderr, "usage: %s MODEL_DIR CHECKPOINT_DIR PLUGIN_DIR MAX_STEPS\n", argv[0]);
        return 2;
    }
    const std::string model_dir = argv[1], dir = argv[2];
    const long max_steps = std::strtol(argv[4], nullptr, 10);
    rl_runtime_t *rt = rl_train_test::plugin_runtime(argv[3]);
    if (!rt) return fail("runtime");
    rl_model_t *model = nullptr;
    rl_trainer_t *trainer = nullptr;
    rl_instance_t *loss = nullptr;
    if (rl_model_load(model_dir.c_str(), "{\"threads\": 1}", &model) != RL_OK) return fail("model");
    if (rl_trainer_create(model, "{\"learning_rate\": 1e-3}", &trainer) != RL_OK)
        return fail("trainer");
    if (rl_instance_create(rt, "loss", "causallm_loss", "{}", &loss) != RL_OK) return fail("loss");

    long step = 0;
    rl_result_t *r = nullptr;
    const rl_status_t st = rl_trainer_load_checkpoint(trainer, dir.c_str(), &r);
    if (st == RL_OK) {
        double s = 0;
        rl_result_scalar(r, "step", &s);
        step = static_cast<long>(s);
    } else if (st != RL_ERR_NOT_FOUND) {
        return fail("load checkpoint");
    }
    rl_result_destroy(r);
    std::printf("resumed %ld\n", step);
    std::fflush(stdout);

    // The same two sequences every step: the parameters after step N depend on N only.
    std::vector<int64_t> ids;
    for (const char *s : {"Reverse: abc\ncba\n", "Reverse: hello\nolleh\n"})
        for (const char *p = s; *p; ++p) ids.push_back(static_cast<unsigned char>(*p));
    std::vector<int64_t> cu = {0, 17, static_cast<int64_t>(ids.size())};
    int64_t n_ids = static_cast<int64_t>(ids.size()), n_cu = 3;
    rl_batch_t batch{};
    batch.struct_size = sizeof(batch);
    batch.input_ids = {ids.data(), {RL_DEVICE_CPU, 0}, 1, {RL_DTYPE_INT, 64, 1}, &n_ids, nullptr,
                       0};
    batch.cu_seqlens = {cu.data(), {RL_DEVICE_CPU, 0}, 1, {RL_DTYPE_INT, 64, 1}, &n_cu, nullptr, 0};

    while (step < max_steps) {
        if (rl_trainer_forward_backward(trainer, &batch, loss, &r) != RL_OK)
            return fail("forward_backward");
        rl_result_destroy(r);
        if (rl_trainer_optim_step(trainer, nullptr, &r) != RL_OK) return fail("optim_step");
        rl_result_destroy(r);
        ++step;
        std::printf("saving %ld\n", step);
        std::fflush(stdout);
        const std::string state = "{\"data_position\": " + std::to_string(step * 2) + "}";
        if (rl_trainer_save_checkpoint(trainer, dir.c_str(), state.c_str(), &r) != RL_OK)
            return fail("save checkpoint");
        rl_result_destroy(r);
        std::printf("saved %ld\n", step);
        std::fflush(stdout);
    }
    rl_instance_destroy(loss);
    rl_trainer_destroy(trainer);
    rl_model_destroy(model);
    rl_runtime_destroy(rt);
    return 0;
}
