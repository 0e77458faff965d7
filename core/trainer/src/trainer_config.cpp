#include "rl/core/trainer_config.hpp"

#include "rl/core/train_error.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

namespace rl::core {
namespace {

using nlohmann::json;

[[noreturn]] void bad(const std::string &msg) {
    throw TrainError(ErrorKind::InvalidArgument, msg);
}

json parse_object(const std::string &text, const std::string &what) {
    if (text.empty()) return json::object();
    json j = json::parse(text, nullptr, false);
    if (j.is_discarded()) bad(what + ": not valid JSON");
    if (j.is_null()) return json::object();
    if (!j.is_object()) bad(what + ": must be a JSON object, got " + std::string(j.type_name()));
    return j;
}

double number(const json &v, const std::string &key) {
    if (!v.is_number()) bad(key + " must be a number, got " + std::string(v.type_name()));
    const double x = v.get<double>();
    if (!std::isfinite(x)) bad(key + " must be finite");
    return x;
}

int64_t integer(const json &v, const std::string &key) {
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_number_float()) {
        const double x = v.get<double>();
        if (std::isfinite(x) && x == std::floor(x) && std::fabs(x) < 9e15)
            return static_cast<int64_t>(x);
    }
    bad(key + " must be an integer, got " + v.dump());
}

bool boolean(const json &v, const std::string &key) {
    if (!v.is_boolean()) bad(key + " must be true or false, got " + v.dump());
    return v.get<bool>();
}

std::string keys_of(const std::map<std::string, std::function<void(const json &)>> &m) {
    std::string s;
    for (const auto &kv : m) s += (s.empty() ? "" : ", ") + kv.first;
    return s;
}

} // namespace

const char *lr_schedule_name(LrSchedule s) {
    switch (s) {
        case LrSchedule::Constant:
            return "constant";
        case LrSchedule::LinearWarmup:
            return "linear_warmup";
        case LrSchedule::Cosine:
            return "cosine";
    }
    return "?";
}

TrainerConfig TrainerConfig::from_json(const std::string &text) {
    const json j = parse_object(text, "trainer config");
    TrainerConfig c;
    const std::string p = "trainer.";
    std::map<std::string, std::function<void(const json &)>> setters = {
        {"learning_rate", [&](const json &v) { c.learning_rate = number(v, p + "learning_rate"); }},
        {"beta1", [&](const json &v) { c.beta1 = number(v, p + "beta1"); }},
        {"beta2", [&](const json &v) { c.beta2 = number(v, p + "beta2"); }},
        {"eps", [&](const json &v) { c.eps = number(v, p + "eps"); }},
        {"weight_decay", [&](const json &v) { c.weight_decay = number(v, p + "weight_decay"); }},
        {"gradient_clip", [&](const json &v) { c.gradient_clip = number(v, p + "gradient_clip"); }},
        {"lr_schedule",
         [&](const json &v) {
             const std::string s = v.is_string() ? v.get<std::string>() : v.dump();
             if (s == "constant")
                 c.lr_schedule = LrSchedule::Constant;
             else if (s == "linear_warmup")
                 c.lr_schedule = LrSchedule::LinearWarmup;
             else if (s == "cosine")
                 c.lr_schedule = LrSchedule::Cosine;
             else
                 bad(p + "lr_schedule '" + s +
                     "' is unknown; valid: constant, linear_warmup, cosine");
         }},
        {"warmup_steps", [&](const json &v) { c.warmup_steps = integer(v, p + "warmup_steps"); }},
        {"min_lr_ratio", [&](const json &v) { c.min_lr_ratio = number(v, p + "min_lr_ratio"); }},
        {"total_steps", [&](const json &v) { c.total_steps = integer(v, "total_steps"); }},
        {"enable_packing",
         [&](const json &v) { c.packing.enable_packing = boolean(v, p + "enable_packing"); }},
        {"sample_packing_sequence_len",
         [&](const json &v) {
             c.packing.sample_packing_sequence_len = integer(v, p + "sample_packing_sequence_len");
         }},
        {"micro_batch_tokens",
         [&](const json &v) {
             c.packing.micro_batch_tokens = integer(v, p + "micro_batch_tokens");
         }},
        {"logprob_chunk_tokens",
         [&](const json &v) { c.logprob_chunk_tokens = integer(v, p + "logprob_chunk_tokens"); }},
        {"activation_checkpointing",
         [&](const json &v) {
             c.activation_checkpointing = boolean(v, p + "activation_checkpointing");
         }},
        {"seed",
         [&](const json &v) {
             if (v.is_null()) return;
             const int64_t s = integer(v, "seed");
             if (s < 0) bad("seed must be >= 0, got " + std::to_string(s));
             c.seed = static_cast<uint64_t>(s);
         }},
    };
    for (const auto &kv : j.items()) {
        auto it = setters.find(kv.key());
        if (it == setters.end())
            bad("trainer config: unknown key '" + kv.key() + "'; valid: " + keys_of(setters));
        it->second(kv.value());
    }
    c.validate();
    return c;
}

void TrainerConfig::validate() const {
    const std::string p = "trainer.";
    auto num = [](double x) { return json(x).dump(); };
    if (!(learning_rate >= 0)) bad(p + "learning_rate must be >= 0, got " + num(learning_rate));
    if (!(beta1 >= 0 && beta1 < 1)) bad(p + "beta1 must be in [0, 1), got " + num(beta1));
    if (!(beta2 >= 0 && beta2 < 1)) bad(p + "beta2 must be in [0, 1), got " + num(beta2));
    if (!(eps >= 0)) bad(p + "eps must be >= 0, got " + num(eps));
    if (!(weight_decay >= 0)) bad(p + "weight_decay must be >= 0, got " + num(weight_decay));
    if (!(gradient_clip >= 0))
        bad(p + "gradient_clip must be >= 0 (0: no clipping), got " + num(gradient_clip));
    if (warmup_steps < 0) bad(p + "warmup_steps must be >= 0, got " + std::to_string(warmup_steps));
    if (total_steps < 0) bad("total_steps must be >= 0, got " + std::to_string(total_steps));
    if (!(min_lr_ratio >= 0 && min_lr_ratio <= 1))
        bad(p + "min_lr_ratio must be in [0, 1], got " + num(min_lr_ratio));
    if (lr_schedule == LrSchedule::Constant && warmup_steps > 0)
        bad(p + "warmup_steps (" + std::to_string(warmup_steps) +
            ") needs lr_schedule linear_warmup or cosine; lr_schedule is constant");
    if (lr_schedule != LrSchedule::Cosine && min_lr_ratio != 0)
        bad(p + "min_lr_ratio only applies to lr_schedule cosine; lr_schedule is " +
            lr_schedule_name(lr_schedule));
    if (lr_schedule == LrSchedule::Cosine && total_steps <= warmup_steps)
        bad("lr_schedule cosine needs total_steps (" + std::to_string(total_steps) +
            ") greater than trainer.warmup_steps (" + std::to_string(warmup_steps) + ")");
    if (packing.sample_packing_sequence_len <= 0)
        bad(p + "sample_packing_sequence_len must be positive, got " +
            std::to_string(packing.sample_packing_sequence_len));
    if (packing.micro_batch_tokens <= 0)
        bad(p + "micro_batch_tokens must be positive, got " +
            std::to_string(packing.micro_batch_tokens));
    if (logprob_chunk_tokens <= 0)
        bad(p + "logprob_chunk_tokens must be positive, got " +
            std::to_string(logprob_chunk_tokens));
}

std::string TrainerConfig::to_json() const {
    json j = {{"learning_rate", learning_rate},
              {"beta1", beta1},
              {"beta2", beta2},
              {"eps", eps},
              {"weight_decay", weight_decay},
              {"gradient_clip", gradient_clip},
              {"lr_schedule", lr_schedule_name(lr_schedule)},
              {"warmup_steps", warmup_steps},
              {"min_lr_ratio", min_lr_ratio},
              {"total_steps", total_steps},
              {"enable_packing", packing.enable_packing},
              {"sample_packing_sequence_len", packing.sample_packing_sequence_len},
              {"micro_batch_tokens", packing.micro_batch_tokens},
              {"logprob_chunk_tokens", logprob_chunk_tokens},
              {"activation_checkpointing", activation_checkpointing}};
    j["seed"] = seed ? json(*seed) : json(nullptr);
    return j.dump();
}

double scheduled_learning_rate(const TrainerConfig &c, double lr, int64_t step) {
    if (c.lr_schedule == LrSchedule::Constant) return lr;
    if (step < c.warmup_steps)
        return lr * static_cast<double>(step + 1) / static_cast<double>(c.warmup_steps);
    if (c.lr_schedule == LrSchedule::LinearWarmup) return lr;
    const double span = static_cast<double>(c.total_steps - c.warmup_steps);
    double progress = span > 0 ? static_cast<double>(step - c.warmup_steps) / span : 1.0;
    progress = std::min(1.0, std::max(0.0, progress));
    const double r = c.min_lr_ratio;
    return lr * (r + (1.0 - r) * 0.5 * (1.0 + std::cos(M_PI * progress)));
}

OptimOverrides OptimOverrides::from_json(const std::string &text) {
    const json j = parse_object(text, "optim_step params");
    OptimOverrides o;
    std::map<std::string, std::function<void(const json &)>> setters = {
        {"learning_rate", [&](const json &v) { o.learning_rate = number(v, "learning_rate"); }},
        {"beta1", [&](const json &v) { o.beta1 = number(v, "beta1"); }},
        {"beta2", [&](const json &v) { o.beta2 = number(v, "beta2"); }},
        {"eps", [&](const json &v) { o.eps = number(v, "eps"); }},
        {"weight_decay", [&](const json &v) { o.weight_decay = number(v, "weight_decay"); }},
        {"gradient_clip", [&](const json &v) { o.gradient_clip = number(v, "gradient_clip"); }},
    };
    for (const auto &kv : j.items()) {
        auto it = setters.find(kv.key());
        if (it == setters.end())
            bad("optim_step params: unknown key '" + kv.key() + "'; valid: " + keys_of(setters));
        it->second(kv.value());
    }
    auto check_range = [](const std::optional<double> &v, const char *name, double lo, bool lo_open,
                          double hi, bool hi_open) {
        if (!v) return;
        const bool ok = (lo_open ? *v > lo : *v >= lo) && (hi_open ? *v < hi : *v <= hi);
        if (!ok)
            bad(std::string("optim_step params: ") + name + " = " + json(*v).dump() +
                " is out of range");
    };
    const double inf = HUGE_VAL;
    check_range(o.learning_rate, "learning_rate", 0, false, inf, false);
    check_range(o.beta1, "beta1", 0, false, 1, true);
    check_range(o.beta2, "beta2", 0, false, 1, true);
    check_range(o.eps, "eps", 0, false, inf, false);
    check_range(o.weight_decay, "weight_decay", 0, false, inf, false);
    check_range(o.gradient_clip, "gradient_clip", 0, false, inf, false);
    return o;
}

} // namespace rl::core
