// The trainer's checkpoints (docs/trainer.md, "Checkpoints"): collecting the
// optimizer state (gathered over fsdp shards and expert-parallel ranks),
// writing a checkpoint folder atomically, and loading one, at this or another
// world size.
#include "rl/core/trainer.hpp"

#include "expert_parallel.hpp"
#include "fsdp.hpp"
#include "optimizer_state.hpp"

#include "rl/core/atomic_file.hpp"
#include "rl/core/checkpoint.hpp"
#include "rl/core/dist.hpp"
#include "rl/core/json.hpp"
#include "rl/core/pretrained.hpp"
#include "rl/core/safetensors.hpp"
#include "rl/core/tensor_io.hpp"

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <set>

namespace rl::core {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char *kCheckpointFormat = "rl-trainer-checkpoint/1";
constexpr const char *kMasterFile = "master_weights.safetensors";
constexpr const char *kAdapterFolder = "adapter"; // a LoRA trainer's checkpoint: PEFT folder

[[noreturn]] void invalid(const std::string &msg) {
    throw Error(ErrorKind::InvalidArgument, msg);
}

// Loads every tensor of a saved model folder (single file or sharded).
std::map<std::string, at::Tensor> load_model_tensors(const fs::path &dir) {
    std::map<std::string, at::Tensor> out;
    const fs::path single = dir / "model.safetensors";
    const fs::path index = dir / "model.safetensors.index.json";
    if (fs::exists(index)) {
        const SafetensorsIndex idx = read_safetensors_index(index.string());
        std::set<std::string> files;
        for (const auto &kv : idx.weight_map) files.insert(kv.second);
        for (const auto &f : files)
            for (auto &kv : load_safetensors((dir / f).string())) out.insert(std::move(kv));
    } else {
        out = load_safetensors(single.string());
    }
    return out;
}

} // namespace

// -- checkpoints ----------------------------------------------------------------

void Trainer::collect_state(std::vector<std::pair<std::string, at::Tensor>> &opt,
                            std::vector<std::pair<std::string, at::Tensor>> &masters) {
    at::NoGradGuard no_grad;
    auto add_moments = [&](const std::string &name, const at::Tensor &exp_avg,
                           const at::Tensor &exp_avg_sq, int64_t step) {
        opt.emplace_back("exp_avg." + name, exp_avg.to(at::kCPU));
        opt.emplace_back("exp_avg_sq." + name, exp_avg_sq.to(at::kCPU));
        opt.emplace_back("step." + name, at::full({1}, step, at::kLong));
    };
    if (!fsdp_) {
        std::map<const void *, size_t> index_of; // expert parallelism: owned experts
        for (size_t i = 0; i < params_.size(); ++i) {
            const std::string &name = params_[i].first;
            if (ep_ && ep_->is_expert(params_[i].second)) {
                index_of[params_[i].second.unsafeGetTensorImpl()] = i;
                continue;
            }
            if (masters_[i].defined()) masters.emplace_back(name, masters_[i].to(at::kCPU));
            auto it = optimizer_->state().find(state_key_of(optimized(i)));
            if (it == optimizer_->state().end()) continue;
            auto &st = static_cast<torch::optim::AdamWParamState &>(*it->second);
            add_moments(name, st.exp_avg(), st.exp_avg_sq(), st.step());
        }
        if (!ep_) return;
        // Expert parallelism: every expert's state, gathered from its ranks.
        const bool low_precision =
            policy_->model().dtype() != at::kFloat && policy_->model().dtype() != at::kDouble;
        const auto states = ep_->gather_state(
            [&](const at::Tensor &weight) {
                ExpertParallel::State st;
                const size_t i = index_of.at(weight.unsafeGetTensorImpl());
                if (masters_[i].defined()) st.master = masters_[i];
                auto it = optimizer_->state().find(state_key_of(optimized(i)));
                if (it == optimizer_->state().end()) return st;
                auto &adam = static_cast<torch::optim::AdamWParamState &>(*it->second);
                st.exp_avg = adam.exp_avg();
                st.exp_avg_sq = adam.exp_avg_sq();
                st.step = adam.step();
                return st;
            },
            low_precision);
        for (const auto &[name, st] : states) {
            if (low_precision) masters.emplace_back(name, st.master);
            if (st.step >= 0) add_moments(name, st.exp_avg, st.exp_avg_sq, st.step);
        }
        return;
    }
    // fsdp: every rank's shards gathered into whole tensors (a collective).
    auto &units = fsdp_->units();
    std::vector<at::Tensor> m, ea, eas;
    std::vector<int64_t> steps;
    for (auto &u : units) {
        m.push_back(u.master);
        auto it = optimizer_->state().find(state_key_of(u.master));
        if (it == optimizer_->state().end()) {
            ea.push_back(at::zeros_like(u.master));
            eas.push_back(at::zeros_like(u.master));
            steps.push_back(-1);
            continue;
        }
        auto &st = static_cast<torch::optim::AdamWParamState &>(*it->second);
        ea.push_back(st.exp_avg());
        eas.push_back(st.exp_avg_sq());
        steps.push_back(st.step());
    }
    const std::vector<at::Tensor> full_m = fsdp_->gather_full(m);
    const std::vector<at::Tensor> full_ea = fsdp_->gather_full(ea);
    const std::vector<at::Tensor> full_eas = fsdp_->gather_full(eas);
    const bool low_precision = policy_->model().dtype() != at::kFloat;
    for (size_t ui = 0; ui < units.size(); ++ui)
        for (size_t i : units[ui].params) {
            const std::string &name = params_[i].first;
            if (low_precision) masters.emplace_back(name, full_m[i].to(at::kCPU));
            if (steps[ui] >= 0) add_moments(name, full_ea[i], full_eas[i], steps[ui]);
        }
    fsdp_->materialize(); // the model folder is written from the whole weights
}

std::string Trainer::save_checkpoint(const std::string &dir, const std::string &state_json) {
    require(!config_.forward_only, ErrorKind::BadState,
            "save_checkpoint: a forward-only trainer (trainer.forward_only) has no training state "
            "to save; save the model instead");
    json state = json::object();
    if (!state_json.empty()) {
        state = rl::core::parse_json_or_discarded(state_json);
        if (state.is_discarded() || !(state.is_object() || state.is_null()))
            invalid("checkpoint state must be a JSON object");
        if (state.is_null()) state = json::object();
    }
    if (writes_sharded_checkpoints()) return save_sharded_checkpoint(dir, state.dump());
    std::vector<std::pair<std::string, at::Tensor>> opt, masters;
    collect_state(opt, masters);
    if (!group_) return write_checkpoint(dir, state.dump(), opt, masters);
    // Distributed: rank 0 writes (the replicas are equal; fsdp gathered the
    // shards above), every rank learns the outcome.
    std::string outcome;
    if (group_->rank() == 0) {
        try {
            outcome = "ok\n" + write_checkpoint(dir, state.dump(), opt, masters);
        } catch (const std::exception &e) {
            outcome = std::string("error\n") + e.what();
        }
    }
    outcome = group_->broadcast_bytes(outcome, 0);
    const size_t nl = outcome.find('\n');
    if (outcome.compare(0, nl, "ok") != 0)
        throw Error(ErrorKind::Io, "checkpoint (written by rank 0): " + outcome.substr(nl + 1));
    return outcome.substr(nl + 1);
}

std::string Trainer::write_checkpoint(const std::string &dir, const std::string &state,
                                      std::vector<std::pair<std::string, at::Tensor>> &opt,
                                      std::vector<std::pair<std::string, at::Tensor>> &masters) {
    const std::string tmp = begin_checkpoint(dir, step_);
    try {
        const fs::path root(tmp);
        if (adapter_)
            save_adapter(*adapter_, (root / kAdapterFolder).string()); // the adapter alone
        else
            save_pretrained(policy_->model(), (root / "model").string());
        // The critic's head, beside the weights it belongs with.
        if (const auto &head = policy_->value_head())
            head->save((root / (adapter_ ? kAdapterFolder : "model") / kValueHeadFile).string());
        // Optimizer moments, by parameter name.
        save_safetensors((root / "optimizer.safetensors").string(), opt,
                         {{"format", "pt"}, {"optimizer", "adamw"}});
        // The float32 masters of a low-precision model: the model folder holds
        // the rounded weights, a resumed run continues from these.
        if (!masters.empty())
            save_safetensors((root / kMasterFile).string(), masters, {{"format", "pt"}});
        write_run_state(tmp, state, "consolidated", static_cast<int64_t>(opt.size() / 3));
        return commit_checkpoint(tmp, dir, step_);
    } catch (...) {
        abandon_checkpoint(tmp);
        throw;
    }
}

// rng.safetensors, trainer.json and state.json of a checkpoint folder.
void Trainer::write_run_state(const std::string &folder, const std::string &state,
                              const std::string &layout, int64_t optimizer_params) const {
    const fs::path root(folder);
    at::Tensor gen_state;
    {
        at::Generator g = at::detail::getDefaultCPUGenerator();
        std::lock_guard<std::mutex> lock(g.mutex());
        gen_state = g.get_state();
    }
    save_safetensors((root / "rng.safetensors").string(), {{"torch_cpu_generator", gen_state}},
                     {{"format", "pt"}});
    json meta = {{"format", kCheckpointFormat},
                 {"layout", layout},
                 {"step", step_},
                 {"policy_version", policy_->version()},
                 {"sampling_state", policy_->sampling_state()},
                 {"optimizer_params", optimizer_params},
                 {"config", json::parse(config_.to_json())},
                 {"world_size", world_size()},
                 {"strategy", strategy()},
                 {"expert_parallel", ep_ ? ep_->shards() : 1}};
    if (adapter_) {
        meta["adapter"] = adapter_->name();
        meta["adapter_version"] = adapter_->version();
    }
    atomic_write_file((root / "trainer.json").string(), meta.dump(2) + "\n");
    atomic_write_file((root / "state.json").string(), state + "\n");
}

// fsdp: this rank's shards of the whole tensors of a checkpoint (written by
// any world size and strategy).
void Trainer::load_sharded(const std::map<std::string, at::Tensor> &weights,
                           const std::map<std::string, at::Tensor> &opt) {
    at::NoGradGuard no_grad;
    zero_grad();
    optimizer_->state().clear();
    auto &units = fsdp_->units();
    auto by_param = [&](const std::string &prefix) {
        std::vector<at::Tensor> v(params_.size());
        for (size_t i = 0; i < params_.size(); ++i) {
            auto it = (prefix.empty() ? weights : opt).find(prefix + params_[i].first);
            if (it != (prefix.empty() ? weights : opt).end()) v[i] = it->second.to(at::kFloat);
        }
        return v;
    };
    const std::vector<at::Tensor> w = by_param(""), ea = by_param("exp_avg."),
                                  eas = by_param("exp_avg_sq.");
    for (size_t ui = 0; ui < units.size(); ++ui) {
        auto &u = units[ui];
        u.master.copy_(fsdp_->shard_of(ui, w));
        bool has_state = !u.params.empty();
        for (size_t i : u.params) has_state = has_state && ea[i].defined();
        if (!has_state) continue;
        auto st = std::make_unique<torch::optim::AdamWParamState>();
        st->step(opt.at("step." + params_[u.params[0]].first).to(at::kLong).item<int64_t>());
        st->exp_avg(fsdp_->shard_of(ui, ea));
        st->exp_avg_sq(fsdp_->shard_of(ui, eas));
        optimizer_->state()[state_key_of(u.master)] = std::move(st);
    }
    fsdp_->invalidate();
}

CheckpointInfo Trainer::load_checkpoint(const std::string &dir) {
    require(!config_.forward_only, ErrorKind::BadState,
            "load_checkpoint: a forward-only trainer (trainer.forward_only) has no training "
            "state to load");
    if (fsdp_) fsdp_->materialize(); // the checks below compare whole shapes
    const auto latest = latest_checkpoint(dir);
    require(latest.has_value(), ErrorKind::NotFound,
            "no complete checkpoint (step_<N>/ with a '" + std::string(kCheckpointMarker) +
                "' marker) under '" + dir + "'");
    const fs::path root(latest->path);
    auto bad_file = [&](const std::string &file, const std::string &msg) -> Error {
        return Error(ErrorKind::InvalidArgument,
                     "checkpoint '" + (root / file).string() + "': " + msg);
    };

    const json meta =
        rl::core::parse_json_or_discarded(read_file((root / "trainer.json").string()));
    if (meta.is_discarded() || !meta.is_object() || !meta.contains("format") ||
        meta["format"] != kCheckpointFormat)
        throw bad_file("trainer.json", std::string("not a ") + kCheckpointFormat + " file");
    for (const char *key : {"step", "policy_version", "sampling_state"})
        if (!meta.contains(key) || !meta[key].is_number_unsigned())
            throw bad_file("trainer.json",
                           std::string("'") + key + "' is missing or not an integer >= 0");
    const std::string state_text = read_file((root / "state.json").string());
    const json state = rl::core::parse_json_or_discarded(state_text);
    if (state.is_discarded()) throw bad_file("state.json", "not valid JSON");

    const std::string layout = meta.value("layout", "consolidated");
    if (layout != "consolidated" && layout != "sharded")
        throw bad_file("trainer.json", "unknown layout '" + layout + "'");

    // Read and check everything before changing anything.
    const bool has_adapter = fs::exists(root / kAdapterFolder);
    if (adapter_ && !has_adapter)
        throw bad_file(kAdapterFolder, "is missing: the checkpoint holds full weights, this "
                                       "trainer trains LoRA adapter '" +
                                           adapter_->name() + "'");
    if (!adapter_ && has_adapter)
        throw bad_file("model", "is missing: the checkpoint holds a LoRA adapter, this trainer "
                                "trains the full weights");
    if (adapter_) {
        const LoraConfig saved = read_adapter_config((root / kAdapterFolder).string());
        const LoraConfig &mine = adapter_->config();
        if (saved.rank != mine.rank || saved.scale() != mine.scale() ||
            saved.target_modules != mine.target_modules)
            throw bad_file(std::string(kAdapterFolder) + "/adapter_config.json",
                           "the saved adapter (rank " + std::to_string(saved.rank) + ", scale " +
                               json(saved.scale()).dump() +
                               ") differs from this trainer's adapter (rank " +
                               std::to_string(mine.rank) + ", scale " + json(mine.scale()).dump() +
                               ") or its target modules");
        if (meta.contains("adapter_version") && !meta["adapter_version"].is_number_unsigned())
            throw bad_file("trainer.json", "'adapter_version' is not an integer >= 0");
    }
    // A sharded checkpoint's whole tensors are rebuilt from every rank's shards.
    std::map<std::string, at::Tensor> weights, opt;
    if (layout == "sharded") {
        read_sharded_checkpoint(root.string(), weights, opt);
    } else {
        weights =
            adapter_
                ? load_safetensors((root / kAdapterFolder / "adapter_model.safetensors").string())
                : load_model_tensors(root / "model");
        opt = load_safetensors((root / "optimizer.safetensors").string());
    }
    if (const auto &head = policy_->value_head()) {
        const std::string rel =
            std::string(adapter_ ? kAdapterFolder : "model") + "/" + kValueHeadFile;
        if (!fs::exists(root / rel))
            throw bad_file(rel, "is missing: the checkpoint was written by a model without a "
                                "value head (model.value_head)");
        for (auto &kv : head->read((root / rel).string())) weights.insert(std::move(kv));
    }
    std::map<std::string, at::Tensor> rng = load_safetensors((root / "rng.safetensors").string());
    // Float32 masters, when the checkpoint was written by a low-precision
    // model: they replace the rounded model weights as the source.
    if (fs::exists(root / kMasterFile)) {
        std::map<std::string, at::Tensor> masters = load_safetensors((root / kMasterFile).string());
        for (auto &kv : masters) {
            auto it = weights.find(kv.first);
            if (it == weights.end())
                throw bad_file(kMasterFile, "tensor '" + kv.first + "' is not a model weight");
            if (!it->second.sizes().equals(kv.second.sizes()))
                throw bad_file(kMasterFile, "tensor '" + kv.first + "' has shape " +
                                                c10::str(kv.second.sizes()) + ", the model has " +
                                                c10::str(it->second.sizes()));
            it->second = std::move(kv.second);
        }
    }
    // Expert parallelism: the other ranks' experts are read too (the model
    // keeps their weights).
    std::vector<std::pair<std::string, at::Tensor>> expected = params_;
    expected.insert(expected.end(), ep_foreign_.begin(), ep_foreign_.end());
    for (const auto &kv : expected) {
        auto it = weights.find(kv.first);
        if (it == weights.end())
            throw bad_file(adapter_ ? kAdapterFolder : "model",
                           "tensor '" + kv.first + "' is missing");
        if (!it->second.sizes().equals(kv.second.sizes()))
            throw bad_file(adapter_ ? kAdapterFolder : "model",
                           "tensor '" + kv.first + "' has shape " + c10::str(it->second.sizes()) +
                               ", the model has " + c10::str(kv.second.sizes()));
    }
    if (weights.size() != expected.size())
        throw bad_file(adapter_ ? kAdapterFolder : "model",
                       std::to_string(weights.size()) + " tensors, the " +
                           (adapter_ ? "adapter" : "model") + " has " +
                           std::to_string(expected.size()));
    size_t opt_params = 0;
    for (const auto &kv : expected) {
        auto a = opt.find("exp_avg." + kv.first), b = opt.find("exp_avg_sq." + kv.first),
             s = opt.find("step." + kv.first);
        const int present = (a != opt.end()) + (b != opt.end()) + (s != opt.end());
        if (present == 0) continue;
        if (present != 3)
            throw bad_file("optimizer.safetensors", "incomplete state for '" + kv.first + "'");
        if (!a->second.sizes().equals(kv.second.sizes()) ||
            !b->second.sizes().equals(kv.second.sizes()) || s->second.numel() != 1)
            throw bad_file("optimizer.safetensors", "state of '" + kv.first + "' has wrong shapes");
        ++opt_params;
    }
    if (opt_params * 3 != opt.size())
        throw bad_file("optimizer.safetensors", "holds tensors of parameters the model lacks");
    auto gen = rng.find("torch_cpu_generator");
    if (gen == rng.end())
        throw bad_file("rng.safetensors", "tensor 'torch_cpu_generator' is missing");

    // Apply: parameters in place (the engine reads the same tensors).
    if (fsdp_) {
        load_sharded(weights, opt);
    } else {
        at::NoGradGuard no_grad;
        for (size_t i = 0; i < params_.size(); ++i) {
            const at::Tensor &w = weights.at(params_[i].first);
            if (masters_[i].defined()) masters_[i].copy_(w);
            params_[i].second.copy_(w);
        }
        for (auto &kv : ep_foreign_) kv.second.copy_(weights.at(kv.first));
    }
    if (!fsdp_) {
        zero_grad();
        optimizer_->state().clear();
    }
    for (size_t i = 0; i < params_.size() && !fsdp_; ++i) {
        const std::string &name = params_[i].first;
        auto a = opt.find("exp_avg." + name);
        if (a == opt.end()) continue;
        const at::Tensor &p = optimized(i);
        auto st = std::make_unique<torch::optim::AdamWParamState>();
        st->step(opt.at("step." + name).to(at::kLong).item<int64_t>());
        st->exp_avg(a->second.to(p.options()).clone());
        st->exp_avg_sq(opt.at("exp_avg_sq." + name).to(p.options()).clone());
        optimizer_->state()[state_key_of(p)] = std::move(st);
    }
    {
        at::Generator g = at::detail::getDefaultCPUGenerator();
        std::lock_guard<std::mutex> lock(g.mutex());
        g.set_state(gen->second.clone());
    }
    step_ = meta["step"].get<int64_t>();
    if (adapter_) // the policy's version belongs to the base (shared with other adapters)
        adapter_->set_version(meta.value("adapter_version", step_));
    else
        policy_->set_version(meta["policy_version"].get<int64_t>());
    policy_->set_sampling_state(meta["sampling_state"].get<uint64_t>());

    CheckpointInfo info;
    info.path = latest->path;
    info.step = step_;
    info.state_json = state.dump();
    return info;
}

} // namespace rl::core
