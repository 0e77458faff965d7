// Checkpoints through the C API: exact restore of parameters, optimizer
// moments, step and caller state; atomicity against partial folders and
// against a writer process killed with SIGKILL in the middle of saving.
#include "train_util.hpp"

#include <nlohmann/json.hpp>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <chrono>
#include <fstream>
#include <thread>

extern char **environ;

using namespace rl_train_test;
namespace fs = std::filesystem;

namespace {

Batch sft_batch() {
    Batch b;
    for (const char *s : {"Reverse: abc\ncba\n", "Reverse: hello\nolleh\n"}) {
        std::vector<int64_t> ids;
        for (const char *p = s; *p; ++p) ids.push_back(static_cast<unsigned char>(*p));
        b.add(ids);
    }
    return b;
}

Batch probe_batch() {
    return random_batch(77, 3, 12, 20);
}

std::vector<float> probe(rl_trainer_t *t) {
    Batch b = probe_batch();
    Result r;
    if (rl_trainer_forward(t, b.view(), nullptr, r.out()) != RL_OK) {
        ADD_FAILURE() << rl_last_error();
        return {};
    }
    return r.tensor<float>("logprobs");
}

void steps(rl_trainer_t *t, rl_instance_t *loss, int n, Batch data = sft_batch()) {
    for (int i = 0; i < n; ++i) {
        Result r, o;
        ASSERT_EQ(rl_trainer_forward_backward(t, data.view(), loss, r.out()), RL_OK)
            << rl_last_error();
        ASSERT_EQ(rl_trainer_optim_step(t, nullptr, o.out()), RL_OK) << rl_last_error();
    }
}

const char *kConfig = R"({"learning_rate": 1e-3})";

// The causallm loss, the tiny model and its trainer after `n` SFT steps.
struct Trained {
    InstancePtr ce;
    ModelPtr m;
    TrainerPtr t;
};
Trained trained(int n) {
    Trained x{make_loss("causallm_loss"), load_model(), nullptr};
    x.t = make_trainer(x.m.get(), kConfig);
    steps(x.t.get(), x.ce.get(), n);
    return x;
}

} // namespace

TEST(Checkpoint, SaveModifyLoadRestoresParametersOptimizerStepAndState) {
    TempDir dir("ckpt");
    auto [ce, m, t] = trained(2);
    Result saved;
    RL_ASSERT_OK(rl_trainer_save_checkpoint(t.get(), dir.path().c_str(), R"({"data_position": 17})",
                                            saved.out()));
    EXPECT_EQ(saved.text("path"), dir.sub("step_2"));
    EXPECT_TRUE(fs::exists(dir.sub("step_2/complete")));
    EXPECT_TRUE(fs::exists(dir.sub("step_2/model/model.safetensors")));
    EXPECT_TRUE(fs::exists(dir.sub("step_2/model/config.json")));
    EXPECT_TRUE(fs::exists(dir.sub("step_2/model/tokenizer.json")));
    const std::vector<float> at_save = probe(t.get());

    // Reference: the step after the save, taken without any checkpointing.
    Batch other = random_batch(5, 3, 8, 16);
    other.floats.erase("advantages");
    steps(t.get(), ce.get(), 1, other);
    const std::vector<float> continued = probe(t.get());
    steps(t.get(), ce.get(), 2); // modify further

    // Load into the same trainer.
    Result loaded;
    RL_ASSERT_OK(rl_trainer_load_checkpoint(t.get(), dir.path().c_str(), loaded.out()));
    EXPECT_EQ(loaded.scalar("step"), 2);
    EXPECT_EQ(loaded.scalar("policy_version"), 2);
    EXPECT_EQ(nlohmann::json::parse(loaded.text("state"))["data_position"], 17);
    EXPECT_EQ(probe(t.get()), at_save); // bit-exact parameters
    steps(t.get(), ce.get(), 1, other);
    EXPECT_EQ(probe(t.get()), continued); // bit-exact optimizer moments and step

    // Resume in a fresh model + trainer, as a restarted process would.
    ModelPtr m2 = load_model();
    TrainerPtr t2 = make_trainer(m2.get(), kConfig);
    Result loaded2;
    RL_ASSERT_OK(rl_trainer_load_checkpoint(t2.get(), dir.path().c_str(), loaded2.out()));
    EXPECT_EQ(probe(t2.get()), at_save);
    steps(t2.get(), ce.get(), 1, other);
    EXPECT_EQ(probe(t2.get()), continued);
    steps(t2.get(), ce.get(), 1);
    Result info;
    RL_ASSERT_OK(rl_model_info(m2.get(), info.out()));
    EXPECT_EQ(nlohmann::json::parse(info.text("info"))["policy_version"], 4);
}

TEST(Checkpoint, LoadWithoutACompleteCheckpointIsNotFound) {
    TempDir dir("empty");
    ModelPtr m = load_model();
    TrainerPtr t = make_trainer(m.get(), kConfig);
    Result r;
    EXPECT_EQ(rl_trainer_load_checkpoint(t.get(), dir.path().c_str(), r.out()), RL_ERR_NOT_FOUND);
    EXPECT_NE(std::string(rl_last_error()).find(dir.path()), std::string::npos);
    EXPECT_EQ(rl_trainer_load_checkpoint(t.get(), dir.sub("missing").c_str(), r.out()),
              RL_ERR_NOT_FOUND);
}

TEST(Checkpoint, PartialFoldersAreIgnoredAndStaleTempFoldersCleaned) {
    TempDir dir("partial");
    auto [ce, m, t] = trained(1);
    Result r;
    RL_ASSERT_OK(rl_trainer_save_checkpoint(t.get(), dir.path().c_str(), nullptr, r.out()));
    const std::vector<float> at_save = probe(t.get());

    // What crashed writers leave: a newer step without the marker (never
    // produced by our writer, but a copy tool could), and a temporary folder
    // of a process that is gone, holding a marker.
    fs::create_directories(dir.sub("step_9/model"));
    std::ofstream(dir.sub("step_9/model/model.safetensors")) << "truncated";
    const std::string stale = dir.sub(".tmp-step_7-999999999");
    fs::create_directories(stale);
    std::ofstream(stale + "/complete") << "step 7\n";

    steps(t.get(), ce.get(), 1);
    Result loaded;
    RL_ASSERT_OK(rl_trainer_load_checkpoint(t.get(), dir.path().c_str(), loaded.out()));
    EXPECT_EQ(loaded.scalar("step"), 1);
    EXPECT_EQ(loaded.text("state"), "{}");
    EXPECT_EQ(probe(t.get()), at_save);

    // The next save removes the dead process's temporary folder.
    steps(t.get(), ce.get(), 1);
    RL_ASSERT_OK(rl_trainer_save_checkpoint(t.get(), dir.path().c_str(), "{}", r.out()));
    EXPECT_FALSE(fs::exists(stale));
    EXPECT_TRUE(fs::exists(dir.sub("step_2/complete")));
    // Saving the same step again replaces it atomically.
    RL_ASSERT_OK(
        rl_trainer_save_checkpoint(t.get(), dir.path().c_str(), R"({"again": true})", r.out()));
    RL_ASSERT_OK(rl_trainer_load_checkpoint(t.get(), dir.path().c_str(), loaded.out()));
    EXPECT_EQ(loaded.scalar("step"), 2);
    EXPECT_EQ(nlohmann::json::parse(loaded.text("state"))["again"], true);
    for (const auto &e : fs::directory_iterator(dir.path()))
        EXPECT_NE(e.path().filename().string().rfind(".tmp-", 0), 0u) << e.path();
}

TEST(Checkpoint, BadStateJsonIsRefused) {
    TempDir dir("badstate");
    ModelPtr m = load_model();
    TrainerPtr t = make_trainer(m.get(), kConfig);
    Result r;
    EXPECT_EQ(rl_trainer_save_checkpoint(t.get(), dir.path().c_str(), "[1, 2", r.out()),
              RL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(rl_last_error()).find("JSON object"), std::string::npos);
}

namespace {

// Runs the writer until it announced `saving` `k` times, waits `delay`, kills it.
// Returns the last step it announced as saved.
long run_and_kill(const std::string &ckpt_dir, int k, std::chrono::microseconds delay,
                  bool *finished, long *killed_while_saving) {
    int fds[2];
    if (pipe(fds) != 0) return -1;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    const std::string model = tiny_model_dir();
    std::vector<std::string> args = {RL_TEST_CHECKPOINT_WRITER, model, ckpt_dir, RL_TEST_PLUGIN_DIR,
                                     "1000"};
    std::vector<char *> argv;
    for (auto &a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = -1;
    const int rc = posix_spawn(&pid, RL_TEST_CHECKPOINT_WRITER, &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    if (rc != 0) {
        close(fds[0]);
        ADD_FAILURE() << "posix_spawn failed: " << rc;
        return -1;
    }
    FILE *in = fdopen(fds[0], "r");
    char line[128];
    int savings = 0;
    long saved = -1;
    *finished = false;
    while (std::fgets(line, sizeof line, in)) {
        long n = 0;
        if (std::sscanf(line, "saved %ld", &n) == 1) saved = n;
        if (std::sscanf(line, "saving %ld", &n) == 1 && ++savings == k) {
            *killed_while_saving = n;
            std::this_thread::sleep_for(delay);
            kill(pid, SIGKILL);
            break;
        }
    }
    std::fclose(in);
    int status = 0;
    waitpid(pid, &status, 0);
    if (WIFEXITED(status)) {
        *finished = true;
        EXPECT_EQ(WEXITSTATUS(status), 0) << "the writer failed";
    }
    return saved;
}

} // namespace

TEST(Checkpoint, KilledWhileSavingNeverCorruptsACheckpointAndResumeContinuesExactly) {
    TempDir dir("killed");
    const std::string ckpt = dir.sub("ckpt");
    // Kill points from "just started saving" to "probably renaming".
    const int delays_us[] = {0, 300, 1500, 4000, 9000, 20000};
    long last_saved = 0;
    int interrupted = 0; // rounds whose kill left the step being saved incomplete
    ModelPtr checker_model = load_model();
    TrainerPtr checker = make_trainer(checker_model.get(), kConfig);
    for (int round = 0; round < 6; ++round) {
        bool finished = false;
        long saving = -1;
        const long saved =
            run_and_kill(ckpt, 2, std::chrono::microseconds(delays_us[round]), &finished, &saving);
        ASSERT_FALSE(finished);
        if (!fs::exists(ckpt + "/step_" + std::to_string(saving))) ++interrupted;
        if (saved > 0) last_saved = saved;
        // Every complete checkpoint is intact; the newest is at least the last announced.
        long newest = -1;
        for (const auto &e : fs::directory_iterator(ckpt)) {
            const std::string name = e.path().filename().string();
            if (name.rfind("step_", 0) != 0) continue;
            ASSERT_TRUE(fs::exists(e.path() / "complete")) << e.path();
            newest = std::max(newest, std::stol(name.substr(5)));
            // Load this one alone (a folder holding only a link to it).
            TempDir single("single");
            fs::create_directory_symlink(e.path(), single.sub(name));
            Result r;
            ASSERT_EQ(rl_trainer_load_checkpoint(checker.get(), single.path().c_str(), r.out()),
                      RL_OK)
                << e.path() << ": " << rl_last_error();
            const long step = static_cast<long>(r.scalar("step"));
            EXPECT_EQ(name, "step_" + std::to_string(step));
            EXPECT_EQ(nlohmann::json::parse(r.text("state"))["data_position"], 2 * step);
        }
        EXPECT_GE(newest, last_saved);
    }

    EXPECT_GE(interrupted, 1) << "no kill landed inside a save";

    // The newest checkpoint equals an uninterrupted run of as many steps.
    ModelPtr m = load_model();
    TrainerPtr resumed = make_trainer(m.get(), kConfig);
    Result r;
    RL_ASSERT_OK(rl_trainer_load_checkpoint(resumed.get(), ckpt.c_str(), r.out()));
    const int n = static_cast<int>(r.scalar("step"));
    EXPECT_GE(n, 6); // each round resumed and added at least one step
    ModelPtr m2 = load_model();
    TrainerPtr straight = make_trainer(m2.get(), kConfig);
    InstancePtr ce = make_loss("causallm_loss");
    steps(straight.get(), ce.get(), n);
    EXPECT_EQ(probe(resumed.get()), probe(straight.get()));
    steps(resumed.get(), ce.get(), 1);
    steps(straight.get(), ce.get(), 1);
    EXPECT_EQ(probe(resumed.get()), probe(straight.get()));
}
