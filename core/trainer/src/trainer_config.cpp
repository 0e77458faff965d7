#include "rl/core/trainer_config.hpp"

#include "rl/core/error.hpp"
#include "rl/core/names.hpp"
#include "rl/core/params.hpp"
#include "rl/core/json.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

namespace rl::core {
namespace {

using nlohmann::json;

constexpr Named<LrSchedule> kLrSchedules[] = {{LrSchedule::Constant, "constant"},
                                              {LrSchedule::LinearWarmup, "linear_warmup"},
                                              {LrSchedule::Cosine, "cosine"}};

[[noreturn]] void bad(const std::string &msg) {
    throw Error(ErrorKind::InvalidArgument, msg);
}

json parse_object(const std::string &text, const std::string &what) {
    if (text.empty()) return json::object();
    json j = rl::core::parse_json_or_discarded(text);
    if (j.is_discarded()) bad(what + ": not valid JSON");
    if (j.is_null()) return json::object();
    if (!j.is_object()) bad(what + ": must be a JSON object, got " + std::string(j.type_name()));
    return j;
}

} // namespace

const char *lr_schedule_name(LrSchedule s) {
    return name_in(kLrSchedules, s);
}

TrainerConfig TrainerConfig::from_json(const std::string &text) {
    const json j = read_params_text(text, trainer_params(), "trainer", "trainer config");
    TrainerConfig c;
    c.learning_rate = j["learning_rate"].get<double>();
    c.beta1 = j["beta1"].get<double>();
    c.beta2 = j["beta2"].get<double>();
    c.eps = j["eps"].get<double>();
    c.weight_decay = j["weight_decay"].get<double>();
    c.gradient_clip = j["gradient_clip"].get<double>();
    const std::string schedule = j["lr_schedule"].get<std::string>();
    c.lr_schedule = value_in(kLrSchedules, schedule).value_or(LrSchedule::Constant);
    c.warmup_steps = j["warmup_steps"].get<int64_t>();
    c.min_lr_ratio = j["min_lr_ratio"].get<double>();
    c.total_steps = j["total_steps"].get<int64_t>();
    c.packing.enable_packing = j["enable_packing"].get<bool>();
    c.packing.sample_packing_sequence_len = j["sample_packing_sequence_len"].get<int64_t>();
    c.packing.micro_batch_tokens = j["micro_batch_tokens"].get<int64_t>();
    c.logprob_chunk_tokens = j["logprob_chunk_tokens"].get<int64_t>();
    c.activation_checkpointing = j["activation_checkpointing"].get<bool>();
    c.forward_only = j["forward_only"].get<bool>();
    c.parallel = j["parallel"].get<std::string>();
    c.bucket_mb = j["bucket_mb"].get<double>();
    c.checkpoint_format = j["checkpoint_format"].get<std::string>();
    c.overlap_grad_reduce = j["overlap_grad_reduce"].get<bool>();
    c.expert_parallel = j["expert_parallel"].get<int64_t>();
    if (!j["seed"].is_null()) c.seed = j["seed"].get<uint64_t>();
    if (!j["logprob_temperature"].is_null())
        c.logprob_temperature = j["logprob_temperature"].get<double>();
    if (!j["moe_aux_loss_coef"].is_null())
        c.moe_aux_loss_coef = j["moe_aux_loss_coef"].get<double>();
    c.moe_z_loss_coef = j["moe_z_loss_coef"].get<double>();
    c.validate();
    return c;
}

// Single settings are checked against their declarations (trainer_params());
// what remains here are the rules that relate two settings.
void TrainerConfig::validate() const {
    read_params(json::parse(to_json()), trainer_params(), "trainer", "trainer config");
    const std::string p = "trainer.";
    if (lr_schedule == LrSchedule::Constant && warmup_steps > 0)
        bad(p + "warmup_steps (" + std::to_string(warmup_steps) +
            ") needs lr_schedule linear_warmup or cosine; lr_schedule is constant");
    if (lr_schedule != LrSchedule::Cosine && min_lr_ratio != 0)
        bad(p + "min_lr_ratio only applies to lr_schedule cosine; lr_schedule is " +
            lr_schedule_name(lr_schedule));
    if (lr_schedule == LrSchedule::Cosine && total_steps <= warmup_steps)
        bad("lr_schedule cosine needs total_steps (" + std::to_string(total_steps) +
            ") greater than trainer.warmup_steps (" + std::to_string(warmup_steps) + ")");
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
              {"activation_checkpointing", activation_checkpointing},
              {"forward_only", forward_only},
              {"parallel", parallel},
              {"bucket_mb", bucket_mb},
              {"checkpoint_format", checkpoint_format},
              {"overlap_grad_reduce", overlap_grad_reduce},
              {"expert_parallel", expert_parallel}};
    j["seed"] = seed ? json(*seed) : json(nullptr);
    j["logprob_temperature"] = logprob_temperature ? json(*logprob_temperature) : json(nullptr);
    j["moe_aux_loss_coef"] = moe_aux_loss_coef ? json(*moe_aux_loss_coef) : json(nullptr);
    j["moe_z_loss_coef"] = moe_z_loss_coef;
    return j.dump();
}

double logprob_temperature_for(const TrainerConfig &c, std::optional<double> sampling,
                               bool *greedy) {
    if (greedy) *greedy = false;
    if (sampling && !(std::isfinite(*sampling) && *sampling >= 0))
        bad("the batch's sampling temperature must be a finite number >= 0, got " +
            json(*sampling).dump());
    if (sampling && *sampling == 0) {
        if (greedy) *greedy = true;
        return c.logprob_temperature.value_or(1.0);
    }
    if (sampling && c.logprob_temperature &&
        std::fabs(*sampling - *c.logprob_temperature) > 1e-6 * std::max(1.0, *sampling))
        bad("trainer.logprob_temperature is " + json(*c.logprob_temperature).dump() +
            " but the batch was sampled at temperature " + json(*sampling).dump() +
            ": the trainer's logprobs would not be those of the sampling distribution (old and "
            "new logprobs would disagree); set trainer.logprob_temperature to " +
            json(*sampling).dump() + " or leave it null to take the batch's");
    if (sampling) return *sampling;
    return c.logprob_temperature.value_or(1.0);
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
    // The overridable settings, checked against the trainer's declarations.
    static const char *const names[] = {"learning_rate", "beta1",        "beta2",
                                        "eps",           "weight_decay", "gradient_clip"};
    std::vector<ParamSpec> specs;
    for (const auto &s : trainer_params())
        for (const char *n : names)
            if (s.key == n) specs.push_back(s);
    json given = json::object();
    for (const auto &kv : j.items()) given[kv.key()] = kv.value();
    const json checked = read_params(given, specs, "", "optim_step params");
    OptimOverrides o;
    auto take = [&](const char *name, std::optional<double> &field) {
        if (j.contains(name)) field = checked[name].get<double>();
    };
    take("learning_rate", o.learning_rate);
    take("beta1", o.beta1);
    take("beta2", o.beta2);
    take("eps", o.eps);
    take("weight_decay", o.weight_decay);
    take("gradient_clip", o.gradient_clip);
    return o;
}

} // namespace rl::core
