#include "rl/core/policy.hpp"

#include "rl/core/pretrained.hpp"

#include <algorithm>
#include <filesystem>

namespace rl::core {

uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

Policy::Policy(std::shared_ptr<CausalLM> model, std::shared_ptr<const Tokenizer> tokenizer)
    : model_(std::move(model)), tokenizer_(std::move(tokenizer)) {
    check(model_ != nullptr, "Policy: model is null");
}

std::shared_ptr<Policy> Policy::load(const std::string &dir, const LoadOptions &options) {
    auto model = load_pretrained(dir, options);
    std::shared_ptr<const Tokenizer> tok;
    if (std::filesystem::exists(std::filesystem::path(dir) / "tokenizer.json"))
        tok = Tokenizer::from_folder(dir);
    auto policy = std::make_shared<Policy>(std::move(model), std::move(tok));
    policy->set_source_dir(dir);
    if (options.value_head) {
        const CausalLM &m = policy->model();
        require(!m.config().is_classifier(), ErrorKind::InvalidArgument,
                "model folder '" + dir + "' is a " + m.config().class_name() +
                    " (a reward model): it takes no value head (model.value_head)");
        auto head = std::make_shared<ValueHead>(m.config().hidden_size, m.device());
        const std::filesystem::path file = std::filesystem::path(dir) / kValueHeadFile;
        if (std::filesystem::exists(file))
            head->load(file.string());
        else
            head->init_weights(options.value_head_seed);
        policy->set_value_head(std::move(head));
    }
    return policy;
}

void Policy::set_value_head(std::shared_ptr<ValueHead> head) {
    check(head == nullptr || head->hidden_size() == model_->config().hidden_size,
          "Policy: the value head's width differs from the model's hidden size");
    value_head_ = std::move(head);
}

const Tokenizer &Policy::require_tokenizer(const std::string &what) const {
    require(tokenizer_ != nullptr, ErrorKind::BadState,
            what + ": the model folder has no tokenizer.json");
    return *tokenizer_;
}

int64_t Policy::version() const {
    std::lock_guard<std::mutex> lock(mu_);
    return version_;
}

void Policy::set_version(int64_t version) {
    std::lock_guard<std::mutex> lock(mu_);
    version_ = version;
}

int64_t Policy::bump_version() {
    std::lock_guard<std::mutex> lock(mu_);
    return ++version_;
}

std::vector<int64_t> Policy::eos_token_ids() const {
    std::vector<int64_t> ids = model_->config().eos_token_ids;
    if (tokenizer_ && tokenizer_->eos_token_id()) {
        const int64_t e = *tokenizer_->eos_token_id();
        if (std::find(ids.begin(), ids.end(), e) == ids.end()) ids.push_back(e);
    }
    return ids;
}

uint64_t Policy::next_sampling_seed() {
    std::lock_guard<std::mutex> lock(mu_);
    sampling_state_ += 0x9e3779b97f4a7c15ull;
    return mix64(sampling_state_);
}

uint64_t Policy::sampling_state() const {
    std::lock_guard<std::mutex> lock(mu_);
    return sampling_state_;
}

void Policy::set_sampling_state(uint64_t state) {
    std::lock_guard<std::mutex> lock(mu_);
    sampling_state_ = state;
}

// -- adapters ---------------------------------------------------------------------

std::shared_ptr<LoraAdapter> Policy::create_adapter(const std::string &name, LoraConfig config) {
    require(!name.empty(), ErrorKind::InvalidArgument, "adapter name is empty");
    if (config.base_model_name_or_path.empty()) config.base_model_name_or_path = source_dir_;
    {
        std::lock_guard<std::mutex> lock(mu_);
        require(!adapters_.count(name), ErrorKind::InvalidArgument,
                "adapter '" + name + "' exists already");
    }
    auto a = std::make_shared<LoraAdapter>(*model_, name, std::move(config));
    add_adapter(a);
    return a;
}

void Policy::add_adapter(std::shared_ptr<LoraAdapter> adapter, bool replace) {
    require(adapter != nullptr, ErrorKind::InvalidArgument, "add_adapter: adapter is null");
    require(!adapter->name().empty(), ErrorKind::InvalidArgument, "adapter name is empty");
    require(adapter->num_layers() == model_->config().num_hidden_layers, ErrorKind::InvalidArgument,
            "adapter '" + adapter->name() + "' was made for a model with " +
                std::to_string(adapter->num_layers()) + " layers, this one has " +
                std::to_string(model_->config().num_hidden_layers));
    std::lock_guard<std::mutex> lock(mu_);
    auto it = adapters_.find(adapter->name());
    require(replace || it == adapters_.end(), ErrorKind::InvalidArgument,
            "adapter '" + adapter->name() + "' exists already");
    adapters_[adapter->name()] = std::move(adapter);
}

std::shared_ptr<LoraAdapter> Policy::find_adapter(const std::string &name) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = adapters_.find(name);
    return it == adapters_.end() ? nullptr : it->second;
}

std::shared_ptr<LoraAdapter> Policy::adapter(const std::string &name) const {
    auto a = find_adapter(name);
    if (a) return a;
    std::string known;
    for (const auto &n : adapter_names()) known += (known.empty() ? "" : ", ") + n;
    throw Error(ErrorKind::NotFound, "no LoRA adapter '" + name + "' on this model; adapters: " +
                                         (known.empty() ? "(none)" : known));
}

bool Policy::remove_adapter(const std::string &name) {
    std::lock_guard<std::mutex> lock(mu_);
    return adapters_.erase(name) > 0;
}

std::vector<std::string> Policy::adapter_names() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> out;
    for (const auto &kv : adapters_) out.push_back(kv.first);
    return out;
}

} // namespace rl::core
