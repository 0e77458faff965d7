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
    if (options.value_head) {
        const CausalLM &m = policy->model();
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

} // namespace rl::core
