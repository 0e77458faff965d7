#include "rl/core/text.hpp"
#include "rl/core/pretrained.hpp"

#include "rl/core/atomic_file.hpp"
#include "rl/core/error.hpp"
#include "rl/core/names.hpp"
#include "rl/core/safetensors.hpp"
#include "rl/core/tensor_io.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>

namespace rl::core {
namespace fs = std::filesystem;
namespace {

constexpr const char *kSingleFile = "model.safetensors";
constexpr const char *kIndexFile = "model.safetensors.index.json";

bool ends_with(const std::string &s, const std::string &suffix) {
    return s.size() >= suffix.size() &&
           s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Tensors transformers leaves in some checkpoints that carry no weights here.
bool ignorable(const std::string &name, const ModelConfig &c) {
    if (ends_with(name, ".rotary_emb.inv_freq")) return true; // old Llama checkpoints
    if (name == "lm_head.weight" && c.tie_word_embeddings) return true;
    return false;
}

std::string shard_name(size_t i, size_t n) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i, n);
    return buf;
}

bool is_weight_file(const std::string &name) {
    if (name == kSingleFile || name == kIndexFile) return true;
    return name.rfind("model-", 0) == 0 && ends_with(name, ".safetensors");
}

} // namespace

const std::vector<std::string> &aux_file_names() {
    static const std::vector<std::string> names = {"tokenizer.json",
                                                   "tokenizer_config.json",
                                                   "special_tokens_map.json",
                                                   "generation_config.json",
                                                   "added_tokens.json",
                                                   "vocab.json",
                                                   "merges.txt",
                                                   "chat_template.jinja",
                                                   "chat_template.json"};
    return names;
}

std::string dtype_string(at::ScalarType t) {
    static constexpr Named<at::ScalarType> names[] = {{at::kFloat, "float32"},
                                                      {at::kBFloat16, "bfloat16"},
                                                      {at::kHalf, "float16"},
                                                      {at::kDouble, "float64"}};
    if (const char *name = name_in(names, t, nullptr)) return name;
    throw Error("no transformers dtype name for " + std::string(c10::toString(t)));
}

std::shared_ptr<CausalLM> load_pretrained(const std::string &dir, const LoadOptions &options) {
    check(fs::is_directory(dir), "model folder '" + dir + "' does not exist or is not a folder");
    const fs::path root(dir);
    ModelConfig config = ModelConfig::load((root / "config.json").string());
    auto model = std::make_shared<CausalLM>(config, ModelOptions{options.dtype, options.device});

    // Which files hold which tensors.
    std::vector<std::string> files;
    std::map<std::string, std::string> index_map;
    const bool sharded = fs::exists(root / kIndexFile);
    if (sharded) {
        SafetensorsIndex idx = read_safetensors_index((root / kIndexFile).string());
        index_map = idx.weight_map;
        std::set<std::string> unique;
        for (const auto &[name, file] : idx.weight_map)
            if (unique.insert(file).second) files.push_back(file);
        check(!files.empty(), (root / kIndexFile).string() + ": weight_map is empty");
    } else if (fs::exists(root / kSingleFile)) {
        files.push_back(kSingleFile);
    } else {
        throw Error("model folder '" + dir + "' has neither " + kSingleFile + " nor " + kIndexFile);
    }

    std::map<std::string, at::Tensor> params;
    for (auto &[name, p] : model->named_weights()) params[name] = p;
    std::map<std::string, std::string> loaded_from;
    at::NoGradGuard no_grad;
    for (const auto &file : files) {
        const std::string path = (root / file).string();
        auto st = SafetensorsFile::open(path);
        for (const auto &info : st->tensors()) {
            const std::string where = path + ": tensor '" + info.name + "'";
            if (sharded) {
                auto it = index_map.find(info.name);
                if (it == index_map.end()) throw Error(where + " is not listed in " + kIndexFile);
                if (it->second != file)
                    throw Error(where + " is listed in " + kIndexFile + " under '" + it->second +
                                "'");
            }
            auto p = params.find(info.name);
            if (p == params.end()) {
                if (ignorable(info.name, config)) continue;
                throw Error(where + " is unexpected: " + config.class_name() +
                            " with this config has no such parameter");
            }
            auto prev = loaded_from.find(info.name);
            if (prev != loaded_from.end())
                throw Error(where + " was already loaded from '" + prev->second + "'");
            at::Tensor &param = p->second;
            if (!param.sizes().equals(info.shape))
                throw Error(where + " has shape " + shape_text(info.shape) +
                            " but the config needs " + shape_text(param.sizes()));
            const at::ScalarType st_type = to_scalar_type(info.dtype, where);
            check(at::isFloatingType(st_type),
                  where + " has non-float dtype " + dtype_name(info.dtype));
            at::Tensor src = tensor_from_file(st, info);
            if (options.zero_copy && st_type == options.dtype && options.device.is_cpu() &&
                src.data_ptr() == st->data(info)) {
                param.set_data(src);
            } else {
                param.copy_(src);
            }
            loaded_from[info.name] = path;
        }
    }
    std::vector<std::string> missing;
    for (const auto &[name, p] : params)
        if (!loaded_from.count(name)) missing.push_back(name);
    if (!missing.empty()) {
        std::string list;
        for (size_t i = 0; i < missing.size() && i < 5; ++i) list += (i ? ", " : "") + missing[i];
        if (missing.size() > 5) list += ", ... (" + std::to_string(missing.size()) + " in all)";
        std::string why;
        if (config.is_classifier() && std::count(missing.begin(), missing.end(), "score.weight"))
            why = " (config.json names " + config.class_name() +
                  ", whose sequence-classification head is 'score.weight' [num_labels, hidden]; "
                  "this folder's weights have no score head)";
        throw Error("model folder '" + dir + "': missing tensor(s) " + list + why);
    }
    if (sharded) {
        for (const auto &[name, file] : index_map)
            if (!loaded_from.count(name) && !ignorable(name, config))
                throw Error((root / kIndexFile).string() + " lists tensor '" + name + "' in '" +
                            file + "' but that file does not hold it");
    }
    for (const auto &name : aux_file_names()) {
        const fs::path p = root / name;
        if (fs::is_regular_file(p)) model->aux_files()[name] = read_file(p.string());
    }
    return model;
}

void save_pretrained(const CausalLM &model, const std::string &dir, const SaveOptions &options) {
    model.materialize_weights();
    std::error_code ec;
    fs::create_directories(dir, ec);
    check(!ec && fs::is_directory(dir),
          "cannot create model folder '" + dir + "'" + (ec ? ": " + ec.message() : std::string()));
    const fs::path root(dir);
    const at::ScalarType dtype =
        options.dtype == at::ScalarType::Undefined ? model.dtype() : options.dtype;
    const std::string dtype_name_str = dtype_string(dtype);

    // Weights in checkpoint order, converted to the on-disk dtype.
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    uint64_t total = 0;
    for (const auto &[name, p] :
         options.weights.empty() ? model.named_weights() : options.weights) {
        at::Tensor t = p.detach().to(at::kCPU).to(dtype).contiguous();
        total += static_cast<uint64_t>(t.numel() * t.element_size());
        tensors.emplace_back(name, t);
    }
    // Split in order, a new shard when the next tensor would overflow this one.
    std::vector<std::vector<std::pair<std::string, at::Tensor>>> shards(1);
    uint64_t current = 0;
    for (auto &nt : tensors) {
        const uint64_t size = static_cast<uint64_t>(nt.second.numel() * nt.second.element_size());
        if (!shards.back().empty() && current + size > options.max_shard_bytes) {
            shards.emplace_back();
            current = 0;
        }
        shards.back().push_back(nt);
        current += size;
    }

    std::set<std::string> written;
    if (shards.size() == 1) {
        save_safetensors((root / kSingleFile).string(), shards[0]);
        written.insert(kSingleFile);
    } else {
        SafetensorsIndex idx;
        for (size_t i = 0; i < shards.size(); ++i) {
            const std::string name = shard_name(i + 1, shards.size());
            save_safetensors((root / name).string(), shards[i]);
            written.insert(name);
            for (const auto &nt : shards[i]) idx.weight_map[nt.first] = name;
        }
        atomic_write_file((root / kIndexFile).string(), safetensors_index_json(idx, total));
        written.insert(kIndexFile);
    }
    atomic_write_file((root / "config.json").string(), model.config().to_json(dtype_name_str));
    for (const auto &[name, bytes] : model.aux_files())
        atomic_write_file((root / name).string(), bytes);

    // Weight files from an earlier save with another sharding would confuse loaders.
    for (const auto &entry : fs::directory_iterator(root)) {
        const std::string name = entry.path().filename().string();
        if (entry.is_regular_file() && is_weight_file(name) && !written.count(name))
            fs::remove(entry.path(), ec);
    }
    fsync_directory(dir);
}

} // namespace rl::core
