#include "batch.hpp"

namespace rl::host::capi {

namespace core = rl::core;

// The training batch of rollouts taken in order (pushed-rollout layout: prompt
// then completion, loss mask 0 on the prompt, sampling logprobs as
// "old_logprobs").
std::unique_ptr<rl_train_batch> batch_of(const std::vector<const core::Rollout *> &rs,
                                         int64_t groups, const char *fn) {
    auto b = std::make_unique<rl_train_batch>();
    b->groups = groups;
    std::vector<int64_t> ids, cu{0};
    std::vector<float> mask, old;
    std::map<std::string, std::vector<float>> extras;
    // Routing replay (R3): the rollouts' recorded routings, packed like the
    // tokens into the trainer's routed_experts [T, L_moe, K].
    std::vector<int32_t> routed;
    std::vector<float> routed_weights; // their recorded weights (return_expert_logits)
    const bool routes = !rs.empty() && !rs.front()->routed_experts.empty();
    const bool weighed = routes && !rs.front()->routed_expert_weights.empty();
    const int64_t layers = routes ? rs.front()->routed_layers : 0;
    const int64_t k = routes ? rs.front()->routed_k : 0;
    if (!rs.empty()) b->sampling_temperature = rs.front()->sampling_temperature;
    auto temperature_name = [](const std::optional<double> &t) {
        return t ? json(*t).dump() : std::string("none");
    };
    for (size_t i = 0; i < rs.size(); ++i) {
        const core::Rollout &r = *rs[i];
        if (r.sampling_temperature != b->sampling_temperature)
            throw HostError{RL_ERR_BAD_STATE,
                            fn_msg(fn, "rollouts of the batch were sampled at different "
                                       "temperatures (" +
                                           temperature_name(b->sampling_temperature) + " and " +
                                           temperature_name(r.sampling_temperature) + ", group " +
                                           std::to_string(r.group_id) +
                                           "); the trainer scores a batch at one temperature")};
        const size_t n = r.token_ids.size();
        if (routes != !r.routed_experts.empty() ||
            (routes && (r.routed_layers != layers || r.routed_k != k)))
            throw HostError{
                RL_ERR_BAD_STATE,
                fn_msg(fn, "rollouts of the batch carry different routed_experts (group " +
                               std::to_string(r.group_id) + ": " +
                               (r.routed_experts.empty()
                                    ? std::string("none")
                                    : "[" + std::to_string(r.routed_layers) + ", " +
                                          std::to_string(r.routed_k) + "] per token") +
                               ", the batch's first: " +
                               (routes ? "[" + std::to_string(layers) + ", " + std::to_string(k) +
                                             "] per token"
                                       : std::string("none")) +
                               "); sample them all with or all without "
                               "return_routed_experts")};
        if (routes) {
            require(r.routed_experts.size() == n * static_cast<size_t>(layers * k),
                    fn_msg(fn, "a rollout of group " + std::to_string(r.group_id) + " has " +
                                   std::to_string(r.routed_experts.size()) +
                                   " routed_experts ids for " + std::to_string(n) + " tokens"));
            routed.insert(routed.end(), r.routed_experts.begin(), r.routed_experts.end());
            if (weighed != !r.routed_expert_weights.empty())
                throw HostError{
                    RL_ERR_BAD_STATE,
                    fn_msg(fn, std::string("rollouts of the batch carry routed_experts ") +
                                   (weighed ? "with" : "without") + " routing weights and group " +
                                   std::to_string(r.group_id) + (weighed ? " without" : " with") +
                                   "; sample them all with or all without return_expert_logits")};
            routed_weights.insert(routed_weights.end(), r.routed_expert_weights.begin(),
                                  r.routed_expert_weights.end());
        }
        ids.insert(ids.end(), r.token_ids.begin(), r.token_ids.end());
        cu.push_back(static_cast<int64_t>(ids.size()));
        if (r.loss_mask.empty())
            mask.insert(mask.end(), n, 1.0f);
        else
            for (uint8_t m : r.loss_mask) mask.push_back(m ? 1.0f : 0.0f);
        if (r.logprobs.empty())
            old.insert(old.end(), n, 0.0f);
        else
            old.insert(old.end(), r.logprobs.begin(), r.logprobs.end());
        if (i == 0)
            for (const auto &kv : r.extras) extras[kv.first];
        for (auto &kv : extras) {
            auto it = r.extras.find(kv.first);
            if (it == r.extras.end() || r.extras.size() != extras.size())
                throw HostError{RL_ERR_BAD_STATE,
                                fn_msg(fn, "rollouts of the batch carry different extra tensors "
                                           "(group " +
                                               std::to_string(r.group_id) + ")")};
            kv.second.insert(kv.second.end(), it->second.begin(), it->second.end());
        }
        b->rewards.push_back(r.reward);
        b->group_ids.push_back(r.group_id);
        b->policy_versions.push_back(r.policy_version);
        b->tasks.push_back(r.task);
        b->completions.push_back(r.completion);
    }
    b->input_ids = owned_from_vector(ids, rl_dtype_t{RL_DTYPE_INT, 64, 1});
    b->cu_seqlens = owned_from_vector(cu, rl_dtype_t{RL_DTYPE_INT, 64, 1});
    b->tensors["loss_mask"] = owned_from_vector(mask, rl_dtype_t{RL_DTYPE_FLOAT, 32, 1});
    b->tensors["old_logprobs"] = owned_from_vector(old, rl_dtype_t{RL_DTYPE_FLOAT, 32, 1});
    if (routes) {
        OwnedTensor t = owned_from_vector(routed, rl_dtype_t{RL_DTYPE_INT, 32, 1});
        t.shape = {static_cast<int64_t>(ids.size()), layers, k};
        b->tensors["routed_experts"] = std::move(t);
        if (weighed) {
            OwnedTensor w = owned_from_vector(routed_weights, rl_dtype_t{RL_DTYPE_FLOAT, 32, 1});
            w.shape = {static_cast<int64_t>(ids.size()), layers, k};
            b->tensors["routed_expert_weights"] = std::move(w);
        }
    }
    for (const auto &kv : extras) {
        require(!b->tensors.count(kv.first),
                fn_msg(fn, "an extra tensor is named '" + kv.first + "', a batch tensor"));
        b->tensors[kv.first] = owned_from_vector(kv.second, rl_dtype_t{RL_DTYPE_FLOAT, 32, 1});
    }
    b->rebuild_args();
    return b;
}

} // namespace rl::host::capi
