// Sharded checkpoints of the fsdp strategy (docs/distributed.md,
// "Checkpoints"): every rank writes its own shards of the float32 masters and
// AdamW moments into one temporary folder, rank 0 adds the manifest and the
// run state and commits the folder with one rename. Nothing is gathered, so a
// rank never holds more than its shards while saving. Reading rebuilds whole
// tensors from every rank's file, so any world size and strategy resumes.
//
//   step_N/trainer.json              layout "sharded", world size, strategy, ...
//   step_N/state.json, rng.safetensors
//   step_N/shards/manifest.json      units: parameters, shapes, offsets, shard size
//   step_N/shards/rank_R.safetensors unit.U.master / .exp_avg / .exp_avg_sq / .step
#include "rl/core/trainer.hpp"

#include "fsdp.hpp"
#include "optimizer_state.hpp"

#include "rl/core/atomic_file.hpp"
#include "rl/core/checkpoint.hpp"
#include "rl/core/dist.hpp"
#include "rl/core/error.hpp"
#include "rl/core/json.hpp"
#include "rl/core/tensor_io.hpp"

#include <ATen/ATen.h>
#include <c10/util/StringUtil.h>
#include <torch/optim/adamw.h>

#include <nlohmann/json.hpp>

#include <filesystem>

namespace rl::core {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char *kManifestFormat = "rl-fsdp-shards/1";

std::string shard_file(int rank) {
    return "rank_" + std::to_string(rank) + ".safetensors";
}

std::string unit_key(size_t u, const char *what) {
    return "unit." + std::to_string(u) + "." + what;
}

// Every rank learns whether each rank's part succeeded; the first failure
// (lowest rank) is thrown on every rank, naming that rank.
void agree(dist::Group &group, const std::string &mine, const std::string &what) {
    const std::vector<std::string> all = group.all_gather_bytes(mine);
    for (size_t r = 0; r < all.size(); ++r)
        if (!all[r].empty())
            throw Error(ErrorKind::Io,
                        what + " failed on rank " + std::to_string(r) + ": " + all[r]);
}

} // namespace

bool Trainer::writes_sharded_checkpoints() const {
    return fsdp_ != nullptr && config_.checkpoint_format != "consolidated";
}

std::string Trainer::save_sharded_checkpoint(const std::string &dir, const std::string &state) {
    at::NoGradGuard no_grad;
    dist::Group &g = *group_;
    const int rank = g.rank();
    // 1. Rank 0 makes the temporary folder; every rank learns its path.
    std::string tmp, error;
    if (rank == 0) {
        try {
            tmp = begin_checkpoint(dir, step_);
            fs::create_directory(fs::path(tmp) / "shards");
        } catch (const std::exception &e) {
            error = e.what();
        }
    }
    agree(g, error, "checkpoint: creating the folder");
    tmp = g.broadcast_bytes(tmp, 0);

    // 2. Each rank writes its shards.
    error.clear();
    try {
        std::vector<std::pair<std::string, at::Tensor>> tensors;
        auto &units = fsdp_->units();
        for (size_t ui = 0; ui < units.size(); ++ui) {
            const auto &u = units[ui];
            tensors.emplace_back(unit_key(ui, "master"), u.master.to(at::kCPU));
            auto it = optimizer_->state().find(state_key_of(u.master));
            if (it == optimizer_->state().end()) continue;
            auto &st = static_cast<torch::optim::AdamWParamState &>(*it->second);
            tensors.emplace_back(unit_key(ui, "exp_avg"), st.exp_avg().to(at::kCPU));
            tensors.emplace_back(unit_key(ui, "exp_avg_sq"), st.exp_avg_sq().to(at::kCPU));
            tensors.emplace_back(unit_key(ui, "step"), at::full({1}, st.step(), at::kLong));
        }
        save_safetensors((fs::path(tmp) / "shards" / shard_file(rank)).string(), tensors,
                         {{"format", "pt"},
                          {"rank", std::to_string(rank)},
                          {"world_size", std::to_string(g.size())}});
    } catch (const std::exception &e) {
        error = e.what();
    }
    try {
        agree(g, error, "checkpoint: writing the shards");
    } catch (...) {
        if (rank == 0) abandon_checkpoint(tmp);
        throw;
    }

    // 3. Rank 0 writes the manifest and the run state, then commits.
    std::string outcome;
    if (rank == 0) {
        try {
            json units = json::array();
            for (const auto &u : fsdp_->units()) {
                json ps = json::array();
                for (size_t k = 0; k < u.params.size(); ++k) {
                    ps.push_back({{"name", params_[u.params[k]].first},
                                  {"shape", fsdp_->shape_of(u.params[k])},
                                  {"offset", u.offset[k]}});
                }
                units.push_back({{"numel", u.numel}, {"shard", u.shard}, {"params", ps}});
            }
            const json manifest = {{"format", kManifestFormat},
                                   {"world_size", g.size()},
                                   {"dtype", "float32"},
                                   {"units", units}};
            atomic_write_file((fs::path(tmp) / "shards" / "manifest.json").string(),
                              manifest.dump(1) + "\n");
            write_run_state(tmp, state, "sharded", 0);
            outcome = "ok\n" + commit_checkpoint(tmp, dir, step_);
        } catch (const std::exception &e) {
            abandon_checkpoint(tmp);
            outcome = std::string("error\n") + e.what();
        }
    }
    outcome = g.broadcast_bytes(outcome, 0);
    const size_t nl = outcome.find('\n');
    if (outcome.compare(0, nl, "ok") != 0)
        throw Error(ErrorKind::Io, "checkpoint (written by rank 0): " + outcome.substr(nl + 1));
    return outcome.substr(nl + 1);
}

void Trainer::read_sharded_checkpoint(const std::string &folder,
                                      std::map<std::string, at::Tensor> &weights,
                                      std::map<std::string, at::Tensor> &opt) const {
    const fs::path shards = fs::path(folder) / "shards";
    auto bad = [&](const std::string &file, const std::string &msg) {
        return Error(ErrorKind::InvalidArgument,
                     "checkpoint '" + (shards / file).string() + "': " + msg);
    };
    const json m =
        rl::core::parse_json_or_discarded(read_file((shards / "manifest.json").string()));
    if (m.is_discarded() || !m.is_object() || m.value("format", "") != kManifestFormat)
        throw bad("manifest.json", std::string("not a ") + kManifestFormat + " manifest");
    if (!m.contains("world_size") || !m["world_size"].is_number_unsigned() ||
        m["world_size"].get<int64_t>() < 1 || !m.contains("units") || !m["units"].is_array())
        throw bad("manifest.json", "'world_size' (integer >= 1) or 'units' (array) is missing");
    const int64_t W = m["world_size"].get<int64_t>();
    std::vector<std::map<std::string, at::Tensor>> files;
    for (int64_t r = 0; r < W; ++r) {
        const std::string f = shard_file(static_cast<int>(r));
        if (!fs::exists(shards / f))
            throw bad(f, "missing (the manifest names " + std::to_string(W) + " ranks)");
        files.push_back(load_safetensors((shards / f).string()));
    }
    const json &units = m["units"];
    for (size_t ui = 0; ui < units.size(); ++ui) {
        const json &u = units[ui];
        const int64_t shard = u.value("shard", int64_t{-1}), numel = u.value("numel", int64_t{-1});
        if (shard < 0 || numel < 0 || numel > shard * W || !u.contains("params"))
            throw bad("manifest.json", "unit " + std::to_string(ui) + " is malformed");
        // Whole flat unit of one kind, from every rank's shard in rank order.
        auto whole = [&](const char *kind) -> at::Tensor {
            std::vector<at::Tensor> parts;
            for (int64_t r = 0; r < W; ++r) {
                auto it = files[static_cast<size_t>(r)].find(unit_key(ui, kind));
                if (it == files[static_cast<size_t>(r)].end()) {
                    if (std::string(kind) != "master" && r == 0) return at::Tensor();
                    throw bad(shard_file(static_cast<int>(r)),
                              "tensor '" + unit_key(ui, kind) + "' is missing");
                }
                if (it->second.numel() != shard)
                    throw bad(shard_file(static_cast<int>(r)),
                              "tensor '" + unit_key(ui, kind) + "' has " +
                                  std::to_string(it->second.numel()) +
                                  " elements, the manifest says " + std::to_string(shard));
                parts.push_back(it->second.to(at::kFloat).reshape({-1}));
            }
            return at::cat(parts);
        };
        const at::Tensor master = whole("master"), ea = whole("exp_avg"), eas = whole("exp_avg_sq");
        at::Tensor step;
        if (ea.defined()) {
            auto it = files[0].find(unit_key(ui, "step"));
            if (it == files[0].end() || it->second.numel() != 1)
                throw bad(shard_file(0), "tensor '" + unit_key(ui, "step") + "' is missing");
            step = it->second.to(at::kLong).reshape({1});
        }
        for (const json &p : u["params"]) {
            const std::string name = p.value("name", "");
            const int64_t offset = p.value("offset", int64_t{-1});
            std::vector<int64_t> shape;
            if (p.contains("shape") && p["shape"].is_array())
                shape = p["shape"].get<std::vector<int64_t>>();
            int64_t n = 1;
            for (int64_t d : shape) n *= d;
            if (name.empty() || offset < 0 || offset + n > numel)
                throw bad("manifest.json",
                          "unit " + std::to_string(ui) + ": parameter '" + name + "' is malformed");
            weights[name] = master.narrow(0, offset, n).view(shape).clone();
            if (!ea.defined()) continue;
            opt["exp_avg." + name] = ea.narrow(0, offset, n).view(shape).clone();
            opt["exp_avg_sq." + name] = eas.narrow(0, offset, n).view(shape).clone();
            opt["step." + name] = step.clone();
        }
    }
}

} // namespace rl::core
