// Helpers of the trainer / engine / checkpoint / buffer tests: they drive
// everything through the C API of abi/rl/train.h, as an embedder would.
#pragma once

#include "plugin_runtime.hpp"

#include <rl_api.h>

#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace rl_train_test {

#define RL_ASSERT_OK(expr) ASSERT_EQ((expr), RL_OK) << rl_last_error()
#define RL_EXPECT_OK(expr) EXPECT_EQ((expr), RL_OK) << rl_last_error()

// Owns an rl_result_t and reads it.
class Result {
public:
    Result() = default;
    ~Result() { rl_result_destroy(r_); }
    Result(const Result &) = delete;
    Result &operator=(const Result &) = delete;
    rl_result_t **out() {
        rl_result_destroy(r_);
        r_ = nullptr;
        return &r_;
    }
    rl_result_t *get() const { return r_; }

    double scalar(const char *name) const {
        double v = NAN;
        EXPECT_EQ(rl_result_scalar(r_, name, &v), RL_OK) << rl_last_error();
        return v;
    }
    double metric(const char *name) const {
        double v = NAN;
        EXPECT_EQ(rl_result_metric(r_, name, &v), RL_OK) << rl_last_error();
        return v;
    }
    bool has_tensor(const char *name) const {
        rl_tensor_view_t v{};
        return rl_result_tensor(r_, name, &v) == RL_OK;
    }
    std::string text(const char *name) const {
        rl_string_view_t s{};
        EXPECT_EQ(rl_result_text(r_, name, &s), RL_OK) << rl_last_error();
        return std::string(s.data ? s.data : "", s.length);
    }
    template <class T>
    std::vector<T> tensor(const char *name) const {
        rl_tensor_view_t v{};
        EXPECT_EQ(rl_result_tensor(r_, name, &v), RL_OK) << rl_last_error();
        if (v.ndim != 1) return {};
        EXPECT_EQ(v.dtype.bits / 8, sizeof(T)) << name;
        const T *p = static_cast<const T *>(v.data);
        return std::vector<T>(p, p + v.shape[0]);
    }

private:
    rl_result_t *r_ = nullptr;
};

inline rl_tensor_view_t view_of(const void *data, const int64_t *shape, rl_dtype_t dtype) {
    rl_tensor_view_t v{};
    v.data = const_cast<void *>(data);
    v.device = rl_device_t{RL_DEVICE_CPU, 0};
    v.ndim = 1;
    v.dtype = dtype;
    v.shape = const_cast<int64_t *>(shape);
    v.strides = nullptr;
    v.byte_offset = 0;
    return v;
}

constexpr rl_dtype_t kF32{RL_DTYPE_FLOAT, 32, 1};
constexpr rl_dtype_t kF64{RL_DTYPE_FLOAT, 64, 1};
constexpr rl_dtype_t kI64{RL_DTYPE_INT, 64, 1};

// A batch with owned storage; view() builds the rl_batch_t (valid while this lives).
struct Batch {
    std::vector<int64_t> ids;
    std::vector<int64_t> cu{0};
    std::map<std::string, std::vector<float>> floats; // per-token float32
    std::vector<int64_t> labels;                      // optional
    double global_tokens = 0, global_seqs = 0;
    double sampling_temperature = -1; // < 0: the batch carries none

    void add(const std::vector<int64_t> &seq,
             const std::map<std::string, std::vector<float>> &per_token = {}) {
        ids.insert(ids.end(), seq.begin(), seq.end());
        cu.push_back(static_cast<int64_t>(ids.size()));
        for (const auto &kv : per_token) {
            auto &dst = floats[kv.first];
            dst.insert(dst.end(), kv.second.begin(), kv.second.end());
        }
    }
    int64_t n_seqs() const { return static_cast<int64_t>(cu.size()) - 1; }
    std::vector<int64_t> seq(int64_t s) const {
        return std::vector<int64_t>(ids.begin() + cu[s], ids.begin() + cu[s + 1]);
    }
    // Sequences [a, b) as a new batch.
    Batch slice(int64_t a, int64_t b) const {
        Batch out;
        for (int64_t s = a; s < b; ++s) {
            std::map<std::string, std::vector<float>> pt;
            for (const auto &kv : floats)
                pt[kv.first] =
                    std::vector<float>(kv.second.begin() + cu[s], kv.second.begin() + cu[s + 1]);
            out.add(seq(s), pt);
        }
        if (!labels.empty()) out.labels.assign(labels.begin() + cu[a], labels.begin() + cu[b]);
        return out;
    }

    const rl_batch_t *view() {
        n_tok_ = static_cast<int64_t>(ids.size());
        n_cu_ = static_cast<int64_t>(cu.size());
        args_.clear();
        names_.clear();
        shapes_.clear();
        for (auto &kv : floats) {
            names_.push_back(kv.first);
            shapes_.push_back(static_cast<int64_t>(kv.second.size()));
        }
        size_t i = 0;
        for (auto &kv : floats) {
            args_.push_back({names_[i].c_str(), view_of(kv.second.data(), &shapes_[i], kF32)});
            ++i;
        }
        if (!labels.empty()) args_.push_back({"labels", view_of(labels.data(), &n_tok_, kI64)});
        if (global_tokens > 0)
            args_.push_back({"global_tokens", view_of(&global_tokens, &one_, kF64)});
        if (global_seqs > 0) args_.push_back({"global_seqs", view_of(&global_seqs, &one_, kF64)});
        b_ = rl_batch_t{};
        b_.struct_size = sizeof(rl_batch_t);
        b_.input_ids = view_of(ids.data(), &n_tok_, kI64);
        b_.cu_seqlens = view_of(cu.data(), &n_cu_, kI64);
        b_.tensors = rl_tensor_list_t{args_.empty() ? nullptr : args_.data(), args_.size()};
        if (sampling_temperature >= 0) {
            b_.flags = RL_BATCH_HAS_SAMPLING_TEMPERATURE;
            b_.sampling_temperature = sampling_temperature;
        }
        return &b_;
    }

private:
    int64_t n_tok_ = 0, n_cu_ = 0, one_ = 1;
    std::vector<std::string> names_;
    std::vector<int64_t> shapes_;
    std::vector<rl_tensor_arg_t> args_;
    rl_batch_t b_{};
};

// A fresh folder under the system temp dir, removed at exit of the object.
class TempDir {
public:
    explicit TempDir(const std::string &tag) {
        path_ = (std::filesystem::temp_directory_path() /
                 ("rl-train-" + tag + "-" + std::to_string(::getpid()) + "-" +
                  std::to_string(counter()++)))
                    .string();
        std::filesystem::remove_all(path_);
        std::filesystem::create_directories(path_);
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);
    }
    const std::string &path() const { return path_; }
    std::string sub(const std::string &name) const { return path_ + "/" + name; }

private:
    static int &counter() {
        static int c = 0;
        return c;
    }
    std::string path_;
};

// The tiny model, written once per test process.
inline const std::string &tiny_model_dir() {
    static TempDir dir("model");
    static const std::string path = [] {
        const std::string p = dir.sub("tiny");
        if (rl_model_init_preset("tiny", p.c_str(), 1234) != RL_OK)
            ADD_FAILURE() << "init tiny model: " << rl_last_error();
        return p;
    }();
    return path;
}

// Owning pointers of the C API's objects: Owned<T, rl_T_destroy>.
template <auto Destroy>
struct Destroyer {
    template <class T>
    void operator()(T *p) const {
        Destroy(p);
    }
};
template <class T, auto Destroy>
using Owned = std::unique_ptr<T, Destroyer<Destroy>>;

using ModelPtr = Owned<rl_model_t, rl_model_destroy>;
using TrainerPtr = Owned<rl_trainer_t, rl_trainer_destroy>;
using EnginePtr = Owned<rl_engine_t, rl_engine_destroy>;
using RuntimePtr = Owned<rl_runtime_t, rl_runtime_destroy>;
using InstancePtr = Owned<rl_instance_t, rl_instance_destroy>;
using RolloutsPtr = Owned<rl_rollouts_t, rl_rollouts_destroy>;
using BatchPtr = Owned<rl_train_batch_t, rl_train_batch_destroy>;
using BufferPtr = Owned<rl_buffer_t, rl_buffer_destroy>;

// A training batch's tokens as its info reports them: input_ids, cu_seqlens
// and loss_mask.
struct PackedTokens {
    std::vector<int64_t> ids, cu;
    std::vector<float> mask;
};
inline PackedTokens packed_tokens(const Result &info) {
    return {info.tensor<int64_t>("input_ids"), info.tensor<int64_t>("cu_seqlens"),
            info.tensor<float>("loss_mask")};
}

// The rollouts `r` packed into a training batch (rl_rollouts_to_batch) with
// its info in *info; null, and a test failure, when the packing is refused.
inline BatchPtr to_batch(rl_rollouts_t *r, Result *info) {
    rl_train_batch_t *raw = nullptr;
    if (rl_rollouts_to_batch(r, &raw) != RL_OK) {
        ADD_FAILURE() << "rollouts to batch: " << rl_last_error();
        return nullptr;
    }
    BatchPtr batch(raw);
    EXPECT_EQ(rl_train_batch_info(batch.get(), info->out()), RL_OK) << rl_last_error();
    return batch;
}

inline ModelPtr load_model(const std::string &dir = tiny_model_dir()) {
    rl_model_t *m = nullptr;
    if (rl_model_load(dir.c_str(), "{\"threads\": 1}", &m) != RL_OK)
        ADD_FAILURE() << "load model: " << rl_last_error();
    return ModelPtr(m);
}

inline TrainerPtr make_trainer(rl_model_t *m, const std::string &config) {
    rl_trainer_t *t = nullptr;
    if (rl_trainer_create(m, config.c_str(), &t) != RL_OK)
        ADD_FAILURE() << "create trainer: " << rl_last_error();
    return TrainerPtr(t);
}

inline EnginePtr make_engine(rl_model_t *m, const char *config = nullptr) {
    rl_engine_t *e = nullptr;
    if (rl_engine_create(m, config, &e) != RL_OK)
        ADD_FAILURE() << "create engine: " << rl_last_error();
    return EnginePtr(e);
}

// A runtime with the build's plugins.
inline rl_runtime_t *runtime() {
    static RuntimePtr rt = [] {
        rl_runtime_t *r = plugin_runtime(RL_TEST_PLUGIN_DIR);
        if (!r) ADD_FAILURE() << "runtime: " << rl_last_error();
        return RuntimePtr(r);
    }();
    return rt.get();
}

inline InstancePtr make_loss(const char *name, const char *params = "{}") {
    rl_instance_t *i = nullptr;
    if (rl_instance_create(runtime(), "loss", name, params, &i) != RL_OK)
        ADD_FAILURE() << "create loss " << name << ": " << rl_last_error();
    return InstancePtr(i);
}

inline std::vector<int64_t> encode(rl_model_t *m, const std::string &text) {
    Result r;
    if (rl_tokenizer_encode(m, rl_string_view_t{text.data(), text.size()}, 0, r.out()) != RL_OK) {
        ADD_FAILURE() << rl_last_error();
        return {};
    }
    return r.tensor<int64_t>("ids");
}

// rl_engine_generate on a fresh engine of `m`, the prompts encoded and packed
// one after another (input_ids, cu_seqlens); its result in *out. False, and a
// test failure, when it is refused.
inline bool engine_generate(rl_model_t *m, const std::vector<std::string> &prompts,
                            const char *sampling, Result *out) {
    std::vector<int64_t> ids, cu{0};
    for (const std::string &prompt : prompts) {
        const std::vector<int64_t> tokens = encode(m, prompt);
        ids.insert(ids.end(), tokens.begin(), tokens.end());
        cu.push_back(static_cast<int64_t>(ids.size()));
    }
    const int64_t n_ids = static_cast<int64_t>(ids.size());
    const int64_t n_cu = static_cast<int64_t>(cu.size());
    const rl_tensor_view_t idv = view_of(ids.data(), &n_ids, kI64);
    const rl_tensor_view_t cuv = view_of(cu.data(), &n_cu, kI64);
    EnginePtr e = make_engine(m);
    if (rl_engine_generate(e.get(), &idv, &cuv, sampling, out->out()) != RL_OK) {
        ADD_FAILURE() << "engine generate: " << rl_last_error();
        return false;
    }
    return true;
}

inline double max_abs_diff(const std::vector<float> &a, const std::vector<float> &b) {
    EXPECT_EQ(a.size(), b.size());
    double m = 0;
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
        m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
    return m;
}

// Random token sequences of the tiny vocabulary (bytes), with a prompt part
// (loss_mask 0) and a completion part (loss_mask 1), random advantages.
inline Batch random_batch(uint32_t seed, int n_seqs, int min_len, int max_len) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> len(min_len, max_len), tok(32, 126);
    std::normal_distribution<float> adv(0.0f, 1.0f);
    Batch b;
    for (int s = 0; s < n_seqs; ++s) {
        const int n = len(rng);
        const int prompt = std::max(1, n / 3);
        std::vector<int64_t> ids;
        std::vector<float> mask, a;
        const float seq_adv = adv(rng);
        for (int t = 0; t < n; ++t) {
            ids.push_back(tok(rng));
            mask.push_back(t < prompt ? 0.0f : 1.0f);
            a.push_back(seq_adv);
        }
        b.add(ids, {{"loss_mask", mask}, {"advantages", a}});
    }
    return b;
}

inline int64_t mask_tokens(const Batch &b) {
    int64_t n = 0;
    for (float m : b.floats.at("loss_mask")) n += m != 0;
    return n;
}

} // namespace rl_train_test
