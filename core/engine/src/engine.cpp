#include "rl/core/engine.hpp"

#include "decode_step.hpp"
#include "routing.hpp"

#include "rl/core/device.hpp"
#include "rl/core/error.hpp"
#include "rl/core/moe.hpp"
#include "rl/core/params.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <map>

namespace rl::core {

using nlohmann::json;

namespace {

[[noreturn]] void invalid(const std::string &msg) {
    throw Error(ErrorKind::InvalidArgument, msg);
}

} // namespace

const char *finish_reason_name(FinishReason r) {
    return r == FinishReason::Stop ? "stop" : "length";
}

namespace {

// Python's float floor division (a // b for floats, as Surogate's schedule
// computes its stage), so a stage boundary falls on the same step.
double py_floordiv(double a, double b) {
    const double mod = std::fmod(a, b);
    double div = (a - mod) / b;
    if (mod != 0 && ((b < 0) != (mod < 0))) div -= 1.0;
    if (div == 0) return 0;
    double floordiv = std::floor(div);
    if (div - floordiv > 0.5) floordiv += 1.0;
    return floordiv;
}

} // namespace

double NoiseSchedule::sigma(int64_t step, int64_t total_steps) const {
    if (!enabled || total_steps <= 0) return 0.0;
    // num_stages - 1 noisy stages after the noise-free first one.
    const int64_t noisy = std::max<int64_t>(num_stages - 1, 1);
    const double per_stage = static_cast<double>(total_steps) / static_cast<double>(noisy + 1);
    const double at = static_cast<double>(std::min(step, total_steps));
    const auto stage = static_cast<int64_t>(py_floordiv(at, per_stage));
    if (stage <= 0) return 0.0;
    const int64_t i = std::min(stage - 1, noisy - 1);
    if (noisy == 1) return sigma_start;
    const double e = static_cast<double>(i) / static_cast<double>(noisy - 1);
    return sigma_start * std::pow(sigma_end / sigma_start, e);
}

EngineConfig EngineConfig::from_json(const std::string &text) {
    const json j = read_params_text(text, engine_params(), "engine", "engine config");
    EngineConfig c;
    c.max_batch_sequences = j["max_batch_sequences"].get<int64_t>();
    c.kv_cache_fraction = j["kv_cache_fraction"].get<double>();
    c.adapter = j["adapter"].get<std::string>();
    c.noise.enabled = j["noise_scheduler.enabled"].get<bool>();
    c.noise.sigma_start = j["noise_scheduler.sigma_start"].get<double>();
    c.noise.sigma_end = j["noise_scheduler.sigma_end"].get<double>();
    c.noise.num_stages = j["noise_scheduler.num_stages"].get<int64_t>();
    c.total_steps = j["total_steps"].get<int64_t>();
    c.first_step = j["first_step"].get<int64_t>();
    if (!j["seed"].is_null()) c.seed = j["seed"].get<uint64_t>();
    if (c.noise.enabled && c.total_steps <= 0)
        invalid("engine config: engine.noise_scheduler.enabled needs the run's length: "
                "engine.total_steps must be > 0 (scripts pass run.steps; rl.engine_config does)");
    return c;
}

Engine::Engine(std::shared_ptr<Policy> policy, EngineConfig config)
    : policy_(std::move(policy)), config_(config) {
    require(policy_ != nullptr, ErrorKind::InvalidArgument, "engine: policy is null");
    require(!policy_->model().config().is_classifier(), ErrorKind::InvalidArgument,
            "engine: the model is a " + policy_->model().config().class_name() +
                " (a reward model with a score head, no language-model head): it cannot generate");
    if (config_.noise.enabled) {
        require(config_.noise.sigma_start > 0, ErrorKind::InvalidArgument,
                "engine: noise_scheduler.sigma_start must be > 0");
        require(config_.noise.sigma_end > 0, ErrorKind::InvalidArgument,
                "engine: noise_scheduler.sigma_end must be > 0");
        require(config_.noise.num_stages >= 2, ErrorKind::InvalidArgument,
                "engine: noise_scheduler.num_stages must be >= 2 (the first stage is noise-free)");
        require(config_.total_steps > 0, ErrorKind::InvalidArgument,
                "engine: noise_scheduler.enabled needs total_steps > 0 (the run's length)");
    }
    version_ = policy_->version();
    refresh_noise();
}

Engine::~Engine() = default;

int64_t Engine::sync_weights() {
    version_ = policy_->version();
    if (cache_) cache_->clear_all();
    refresh_noise();
    return policy_version();
}

// QeRL noise: fresh noisy copies of the norm weights for the version just
// adopted, from the model's current (clean) weights. Drawn in float32 on the
// CPU from a generator seeded by (seed, version), so they depend on neither
// the device nor the dtype, nor on how many calls ran before.
void Engine::refresh_noise() {
    const int64_t version = policy_version();
    const int64_t step = std::max<int64_t>(0, version - config_.first_step);
    noise_sigma_ = config_.noise.sigma(step, config_.total_steps);
    noisy_norms_ =
        qerl_noisy_norms(policy_->model(), noise_sigma_, config_.seed.value_or(0), version);
}

NormWeights qerl_noisy_norms(CausalLM &model, double sigma, uint64_t seed, int64_t version) {
    NormWeights out;
    if (!(sigma > 0)) return out;
    model.materialize_weights();
    std::vector<const RMSNorm *> norms;
    for (const auto &layer : model.model->layers) {
        norms.push_back(layer->input_layernorm.get());
        norms.push_back(layer->post_attention_layernorm.get());
    }
    norms.push_back(model.model->norm.get());
    auto gen = at::make_generator<at::CPUGeneratorImpl>(
        mix64(seed ^ mix64(static_cast<uint64_t>(version))));
    at::NoGradGuard no_grad;
    for (const RMSNorm *norm : norms) {
        const at::Tensor &clean = norm->weight;
        at::Tensor noise = at::empty(clean.sizes(), at::kFloat);
        noise.normal_(0.0, sigma, gen);
        at::Tensor noisy = clean.detach().to(at::kCPU, at::kFloat) + noise;
        out.emplace(norm, noisy.to(clean.device(), clean.scalar_type()).contiguous());
    }
    return out;
}

int64_t Engine::policy_version() const {
    if (!config_.adapter.empty())
        if (auto a = policy_->find_adapter(config_.adapter)) return a->version();
    return version_;
}

void Engine::sleep() {
    if (cache_) cache_->release();
    // On CUDA the caching allocator would keep the freed blocks: hand them
    // back so another process (or the trainer) can use the memory.
    release_cached_memory(policy_->model().device());
    asleep_ = true;
}

void Engine::wake_up() {
    if (cache_) cache_->allocate();
    asleep_ = false;
}

int64_t Engine::cache_bytes() const {
    return cache_ ? cache_->bytes() : 0;
}

int64_t Engine::kv_budget_bytes() const {
    const at::Device device = policy_->model().device();
    double total = 0;
    if (device.is_cuda()) {
        total = static_cast<double>(device_memory(device).total_bytes);
    } else {
        const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
        total = pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0;
    }
    if (total <= 0) return 0; // unknown: no budget
    return std::max<int64_t>(1, static_cast<int64_t>(config_.kv_cache_fraction * total));
}

void Engine::ensure_cache(int64_t slots, int64_t capacity) {
    const CausalLM &model = policy_->model();
    // A cache kept from an earlier call with more slots must not outgrow the
    // budget at this call's capacity.
    const int64_t budget = kv_budget_bytes();
    const bool too_big =
        cache_ && budget > 0 &&
        KVCache::bytes_for(model.config(), cache_->num_slots(),
                           std::max(capacity, cache_->capacity()), model.dtype()) > budget;
    if (!cache_ || cache_->num_slots() < slots || too_big) {
        cache_.reset();
        release_cached_memory(model.device());
        cache_.emplace(model.make_cache(slots, capacity));
        return;
    }
    if (!cache_->allocated()) cache_->allocate();
    cache_->clear_all();
    cache_->reserve(capacity);
}

// Checks a call's prompts and parameters, resolves its stop ids, adapter and
// seed, and sizes the waves and the KV cache for `capacity` tokens per sample.
Engine::Prepared Engine::prepare(const std::vector<std::vector<int64_t>> &prompts,
                                 const SamplingParams &params, int64_t capacity, const char *fn) {
    const std::string who = fn;
    require(!asleep_, ErrorKind::BadState, who + ": the engine is asleep (call wake_up first)");
    const int64_t current = policy_->version();
    require(current == version_, ErrorKind::BadState,
            who + ": the model's weights changed (policy version " + std::to_string(current) +
                ") since this engine last synced (version " + std::to_string(version_) +
                "); call sync_weights first");
    params.validate();
    require(!prompts.empty(), ErrorKind::InvalidArgument, who + ": no prompts given");
    if (params.return_routed_experts && !policy_->model().config().has_moe())
        invalid(who + ": return_routed_experts: the model has no sparse MoE layer");
    const ModelConfig &mc = policy_->model().config();
    for (size_t i = 0; i < prompts.size(); ++i) {
        const auto &p = prompts[i];
        if (p.empty()) invalid(who + ": prompt " + std::to_string(i) + " is empty");
        for (size_t t = 0; t < p.size(); ++t)
            if (p[t] < 0 || p[t] >= mc.vocab_size)
                invalid(who + ": prompt " + std::to_string(i) + " token " + std::to_string(t) +
                        " = " + std::to_string(p[t]) + " is outside the vocabulary [0, " +
                        std::to_string(mc.vocab_size) + ")");
        if (mc.max_position_embeddings > 0 &&
            static_cast<int64_t>(p.size()) >= mc.max_position_embeddings)
            invalid(who + ": prompt " + std::to_string(i) + " has " + std::to_string(p.size()) +
                    " tokens; the model's context (max_position_embeddings) is " +
                    std::to_string(mc.max_position_embeddings));
    }
    Prepared prep;
    prep.stop_ids = params.stop_token_ids.value_or(policy_->eos_token_ids());
    for (size_t i = 0; i < prep.stop_ids.size(); ++i)
        if (prep.stop_ids[i] < 0 || prep.stop_ids[i] >= mc.vocab_size)
            invalid("sampling params: stop_token_ids[" + std::to_string(i) +
                    "] = " + std::to_string(prep.stop_ids[i]) + " is outside the vocabulary");
    if (!params.stop.empty()) policy_->require_tokenizer(who + " with stop strings");
    // The LoRA adapter of this call (docs/lora.md): every forward runs with it.
    const std::string &adapter_name = params.adapter.empty() ? config_.adapter : params.adapter;
    if (!adapter_name.empty()) prep.adapter = policy_->adapter(adapter_name);
    prep.seed = params.seed ? *params.seed : policy_->next_sampling_seed();

    const int64_t total = static_cast<int64_t>(prompts.size()) * params.n;
    prep.wave =
        config_.max_batch_sequences > 0 ? std::min(config_.max_batch_sequences, total) : total;
    // The KV budget bounds the samples of one wave.
    const int64_t per_sample = KVCache::bytes_for(mc, 1, capacity, policy_->model().dtype());
    const int64_t budget = kv_budget_bytes();
    if (budget > 0) {
        auto mib = [](int64_t b) { return std::to_string((b + (1 << 20) - 1) >> 20) + " MiB"; };
        require(per_sample <= budget, ErrorKind::InvalidArgument,
                who + ": one sample needs " + mib(per_sample) + " of KV cache (" +
                    std::to_string(capacity) + " tokens), more than the engine's budget of " +
                    mib(budget) +
                    " (engine.kv_cache_fraction = " + json(config_.kv_cache_fraction).dump() +
                    " of the device's memory); lower max_tokens or raise kv_cache_fraction");
        prep.wave = std::min(prep.wave, budget / per_sample);
    }
    ensure_cache(prep.wave, capacity);
    return prep;
}

Generation Engine::generate(const std::vector<std::vector<int64_t>> &prompts,
                            const SamplingParams &params) {
    int64_t longest = 0;
    for (const auto &p : prompts) longest = std::max<int64_t>(longest, p.size());
    const ModelConfig &mc = policy_->model().config();
    int64_t capacity = longest + params.max_tokens;
    if (mc.max_position_embeddings > 0) capacity = std::min(capacity, mc.max_position_embeddings);
    const Prepared prep = prepare(prompts, params, capacity, "generate");
    AdapterScope adapter_scope(prep.adapter, /*training=*/false);
    NormWeightsScope noise_scope(&noisy_norms_); // QeRL noise (empty: the clean norms)

    c10::InferenceMode inference;
    Generation g;
    if (params.return_routed_experts) {
        g.routed_layers = detail::sparse_layers(mc);
        g.routed_k = mc.num_experts_per_tok;
    }
    g.policy_version = prep.adapter ? prep.adapter->version() : version_;
    g.cu_seqlens.push_back(0);
    const int64_t total = static_cast<int64_t>(prompts.size()) * params.n;
    for (int64_t first = 0; first < total; first += prep.wave)
        run_wave(prompts, params, prep, first, std::min(total, first + prep.wave), g);
    return g;
}

// Prefills each prompt of samples [first_sample, end_sample) once, into the
// slot of its first sample, and copies it to the other samples' slots (slot k
// holds sample first_sample + k). Returns the next-token logits per slot.
// With `seqs`: (*seqs)[k], slot k's sequence, gets the prefill's routing of
// its prompt tokens.
at::Tensor Engine::prefill_wave(const std::vector<std::vector<int64_t>> &prompts, int64_t n,
                                int64_t first_sample, int64_t end_sample,
                                std::vector<detail::Sequence> *seqs) {
    CausalLM &model = policy_->model();
    KVCache &cache = *cache_;
    const int64_t count = end_sample - first_sample;
    std::vector<int64_t> prefill_slots;
    std::vector<std::vector<int64_t>> prefill_prompts;
    std::map<int64_t, int64_t> prompt_row; // prompt index -> row of the prefill logits
    std::vector<int64_t> row_of(static_cast<size_t>(count));
    for (int64_t k = 0; k < count; ++k) {
        const int64_t prompt = (first_sample + k) / n;
        auto it = prompt_row.find(prompt);
        if (it == prompt_row.end()) {
            it = prompt_row.emplace(prompt, static_cast<int64_t>(prefill_slots.size())).first;
            prefill_slots.push_back(k);
            prefill_prompts.push_back(prompts[static_cast<size_t>(prompt)]);
        }
        row_of[static_cast<size_t>(k)] = it->second;
    }
    for (int64_t k = 0; k < count; ++k) cache.clear(k);
    std::optional<RouterLogitsRecorder> recorder;
    if (seqs != nullptr) recorder.emplace();
    at::Tensor logits = model.prefill(cache, prefill_slots, prefill_prompts);
    if (seqs != nullptr) {
        // The prefill ran each distinct prompt once, in order of first slot.
        const detail::ForwardRouting routing(recorder->logits(), model.config(),
                                             seqs->front().record_weights);
        std::vector<int64_t> offset{0}; // prefill row -> its first token
        for (const auto &p : prefill_prompts)
            offset.push_back(offset.back() + static_cast<int64_t>(p.size()));
        for (int64_t k = 0; k < count; ++k) {
            const size_t r = static_cast<size_t>(row_of[static_cast<size_t>(k)]);
            routing.append((*seqs)[static_cast<size_t>(k)], offset[r], offset[r + 1] - offset[r]);
        }
    }
    for (int64_t k = 0; k < count; ++k) {
        const int64_t src = prefill_slots[static_cast<size_t>(row_of[static_cast<size_t>(k)])];
        if (src != k) cache.copy_slot(src, k);
    }
    return logits.index_select(0, detail::long_tensor(row_of).to(logits.device()));
}

// Samples [first_sample, end_sample) of a generate call, appended to `g`: one
// prefill, then one decoding step (decode_step.hpp) per token for the samples
// still running.
void Engine::run_wave(const std::vector<std::vector<int64_t>> &prompts,
                      const SamplingParams &params, const Prepared &prep, int64_t first_sample,
                      int64_t end_sample, Generation &g) {
    CausalLM &model = policy_->model();
    KVCache &cache = *cache_;
    const ModelConfig &mc = model.config();
    const int64_t count = end_sample - first_sample;
    const bool record = params.return_routed_experts;
    std::vector<detail::Sequence> seqs =
        detail::start_samples(prompts, params, prep.stop_ids, prep.seed, first_sample, end_sample,
                              mc.max_position_embeddings, policy_->tokenizer(), mc);
    at::Tensor logits =
        prefill_wave(prompts, params.n, first_sample, end_sample, record ? &seqs : nullptr);

    std::vector<detail::End> ends(static_cast<size_t>(count));
    std::vector<int64_t> active(static_cast<size_t>(count));
    for (int64_t k = 0; k < count; ++k) active[static_cast<size_t>(k)] = k;
    for (;;) {
        std::vector<detail::Sequence *> live;
        for (int64_t k : active) live.push_back(&seqs[static_cast<size_t>(k)]);
        std::vector<std::optional<detail::End>> step_ends = detail::step(logits, live);
        std::vector<int64_t> next_active, next_tokens;
        std::vector<detail::Sequence *> next_live;
        for (size_t i = 0; i < active.size(); ++i) {
            if (step_ends[i]) {
                ends[static_cast<size_t>(active[i])] = std::move(*step_ends[i]);
            } else {
                next_active.push_back(active[i]);
                next_tokens.push_back(live[i]->tokens.back());
                next_live.push_back(live[i]);
            }
        }
        active.swap(next_active);
        if (active.empty()) break;
        std::optional<RouterLogitsRecorder> recorder;
        if (record) recorder.emplace();
        logits = model.decode(cache, active, detail::long_tensor(next_tokens));
        // Row i: the routing of the token next_live[i] just read.
        if (record)
            detail::ForwardRouting(recorder->logits(), mc, params.return_expert_logits)
                .append_in_order(next_live);
    }
    for (int64_t k = 0; k < count; ++k) {
        detail::Sequence &q = seqs[static_cast<size_t>(k)];
        detail::pad_unread_routing(q); // the last token was never read: route yourself
        g.token_ids.insert(g.token_ids.end(), q.tokens.begin(), q.tokens.end());
        g.logprobs.insert(g.logprobs.end(), q.logprobs.begin(), q.logprobs.end());
        g.routed_experts.insert(g.routed_experts.end(), q.routed.begin(), q.routed.end());
        g.routed_expert_weights.insert(g.routed_expert_weights.end(), q.routed_weights.begin(),
                                       q.routed_weights.end());
        g.cu_seqlens.push_back(static_cast<int64_t>(g.token_ids.size()));
        g.prompt_index.push_back(q.prompt);
        g.completions.push_back(std::move(ends[static_cast<size_t>(k)].text));
        g.finish_reasons.push_back(ends[static_cast<size_t>(k)].reason);
    }
}

} // namespace rl::core
