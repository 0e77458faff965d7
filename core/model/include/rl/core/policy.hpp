// rl/core/policy.hpp: one model as the RL loop sees it. The trainer and the
// co-located rollout engine share a Policy: the same CausalLM object (the
// engine reads the parameters the optimizer writes, no copy), its tokenizer,
// the policy version (bumped by every optimizer step, adopted by the engine on
// weight sync) and the sampling stream the engine draws seeds from when a call
// gives none (saved in checkpoints, so a resumed run samples as the original).
#pragma once

#include "rl/core/error.hpp"
#include "rl/core/lora.hpp"
#include "rl/core/model.hpp"
#include "rl/core/pretrained.hpp"
#include "rl/core/tokenizer.hpp"

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace rl::core {

class Policy {
public:
    /// `tokenizer` may be null (a folder without tokenizer.json): training
    /// works, text features (decoding, stop strings) refuse.
    Policy(std::shared_ptr<CausalLM> model, std::shared_ptr<const Tokenizer> tokenizer);

    /// Loads a Hugging Face folder (weights in options.dtype on
    /// options.device; the tokenizer when tokenizer.json is present).
    static std::shared_ptr<Policy> load(const std::string &dir, const LoadOptions &options = {});

    CausalLM &model() const { return *model_; }
    const std::shared_ptr<CausalLM> &model_ptr() const { return model_; }
    /// Null when the folder had no tokenizer.json.
    const std::shared_ptr<const Tokenizer> &tokenizer() const { return tokenizer_; }
    /// The tokenizer; throws naming `what` when there is none.
    const Tokenizer &require_tokenizer(const std::string &what) const;

    /// The number of optimizer steps applied to the weights (or restored from
    /// a checkpoint). The engine stamps its samples with the version it synced.
    int64_t version() const;
    void set_version(int64_t version);
    int64_t bump_version();

    /// End-of-sequence ids: config.json's eos_token_id(s) plus the
    /// tokenizer's eos token, deduplicated, in that order.
    std::vector<int64_t> eos_token_ids() const;

    /// The engine's seed stream (splitmix64): each call without an explicit
    /// seed takes the next value.
    uint64_t next_sampling_seed();
    uint64_t sampling_state() const;
    void set_sampling_state(uint64_t state);

    // -- LoRA adapters over this model (docs/lora.md) ------------------------

    /// A fresh adapter (identity) named `name` over this model. An empty
    /// config.base_model_name_or_path becomes the folder the model was loaded
    /// from. InvalidArgument when the name is empty or taken.
    std::shared_ptr<LoraAdapter> create_adapter(const std::string &name, LoraConfig config);
    /// Registers an adapter made over this model elsewhere (load_adapter);
    /// with `replace` an adapter of the same name is dropped first, else a
    /// taken name is an error.
    void add_adapter(std::shared_ptr<LoraAdapter> adapter, bool replace = false);
    /// The adapter named `name`; NotFound naming the adapters there are.
    std::shared_ptr<LoraAdapter> adapter(const std::string &name) const;
    /// The adapter named `name`, or null.
    std::shared_ptr<LoraAdapter> find_adapter(const std::string &name) const;
    /// Drops the registry's reference (trainers and scopes using it keep theirs).
    bool remove_adapter(const std::string &name);
    std::vector<std::string> adapter_names() const;
    /// The folder the model was loaded from ("" when built in memory).
    const std::string &source_dir() const { return source_dir_; }
    void set_source_dir(std::string dir) { source_dir_ = std::move(dir); }

private:
    std::shared_ptr<CausalLM> model_;
    std::shared_ptr<const Tokenizer> tokenizer_;
    mutable std::mutex mu_;
    int64_t version_ = 0;
    uint64_t sampling_state_ = 0;
    std::map<std::string, std::shared_ptr<LoraAdapter>> adapters_;
    std::string source_dir_;
};

/// splitmix64 finalizer: a well-mixed 64-bit function of x.
uint64_t mix64(uint64_t x);

} // namespace rl::core
