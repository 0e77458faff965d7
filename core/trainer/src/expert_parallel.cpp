#include "expert_parallel.hpp"

#include "rl/core/error.hpp"

#include <ATen/ATen.h>

#include <atomic>
#include <map>

namespace rl::core {

class ExpertParallel::Exchange : public ExpertExchange {
public:
    Exchange(int64_t shards, int64_t shard, dist::Group &group)
        : shards_(shards), shard_(shard), group_(group) {}
    int64_t shards() const override { return shards_; }
    int64_t shard() const override { return shard_; }
    bool active() const override { return active_; }
    at::Tensor all_to_all(const at::Tensor &in, const std::vector<int64_t> &in_rows,
                          const std::vector<int64_t> &out_rows) override {
        int64_t n = 0;
        for (int64_t r : out_rows) n += r;
        std::vector<int64_t> shape = in.sizes().vec();
        shape[0] = n;
        at::Tensor out = at::empty(shape, in.options());
        group_.all_to_all(out, in, out_rows, in_rows);
        return out;
    }
    bool active_ = false;

private:
    int64_t shards_, shard_;
    dist::Group &group_;
};

ExpertParallel::ExpertParallel(CausalLM &model, std::shared_ptr<dist::Group> world, int64_t shards)
    : model_(model), world_(std::move(world)), shards_(shards) {
    const int W = world_->size(), r = world_->rank();
    const int64_t E = model.config().num_experts;
    require(shards_ >= 1 && W % shards_ == 0 && E % shards_ == 0, ErrorKind::InvalidArgument,
            "trainer.expert_parallel (" + std::to_string(shards_) +
                ") must divide the world size (" + std::to_string(W) + ") and num_experts (" +
                std::to_string(E) + ")");
    const int N = static_cast<int>(shards_);
    shard_ = r % N;
    const int group = r / N;
    // Every rank makes its expert-parallel trainers in the same order, so
    // the k-th one's subgroups have the same names everywhere.
    static std::atomic<int> made{0};
    const std::string prefix = "ep" + std::to_string(made++) + "/";
    if (N == W) {
        experts_group_ = world_;
    } else {
        std::vector<int> members;
        for (int k = 0; k < N; ++k) members.push_back(group * N + k);
        experts_group_ = world_->subgroup(members, prefix + "experts/" + std::to_string(group));
        std::vector<int> same_shard;
        for (int k = static_cast<int>(shard_); k < W; k += N) same_shard.push_back(k);
        replicas_ = world_->subgroup(same_shard, prefix + "replicas/" + std::to_string(shard_));
    }
    exchange_ = std::make_shared<Exchange>(shards_, shard_, *experts_group_);
    // Expert weights: the shard of each, in checkpoint order.
    std::map<const void *, std::pair<int64_t, int64_t>> shard_of; // shard, block
    const int64_t local = E / shards_;
    int64_t block = 0;
    for (const auto &layer : model.model->layers) {
        if (!layer->moe) continue;
        layer->moe->exchange = exchange_;
        for (int64_t e = 0; e < E; ++e)
            for (const auto &p : layer->moe->experts[static_cast<size_t>(e)]->parameters())
                shard_of[p.unsafeGetTensorImpl()] = {e / local, block};
        ++block;
    }
    for (const auto &kv : model.named_weights()) {
        auto it = shard_of.find(kv.second.unsafeGetTensorImpl());
        if (it == shard_of.end()) continue;
        const auto [shard, b] = it->second;
        if (weights_.empty() || weights_.back().block != b) {
            check(blocks_.empty() || weights_.back().block < b,
                  "expert parallelism: the expert weights of a sparse block are not contiguous "
                  "in the model's weight order");
            blocks_.emplace_back(weights_.size(), weights_.size());
        }
        weights_.push_back({kv.first, kv.second, shard, b});
        shard_by_weight_[kv.second.unsafeGetTensorImpl()] = shard;
        blocks_.back().second = weights_.size();
    }
}

ExpertParallel::~ExpertParallel() {
    for (const auto &layer : model_.model->layers)
        if (layer->moe && layer->moe->exchange == exchange_) layer->moe->exchange.reset();
}

bool ExpertParallel::is_expert(const at::Tensor &p) const {
    return shard_by_weight_.count(p.unsafeGetTensorImpl()) != 0;
}

bool ExpertParallel::owns(const at::Tensor &p) const {
    auto it = shard_by_weight_.find(p.unsafeGetTensorImpl());
    return it == shard_by_weight_.end() || it->second == shard_; // not an expert: replicated
}

ExpertParallel::Active::Active(ExpertParallel *ep) : ep_(ep) {
    if (ep_ != nullptr) ep_->exchange_->active_ = true;
}

ExpertParallel::Active::~Active() {
    if (ep_ != nullptr) ep_->exchange_->active_ = false;
}

void ExpertParallel::refresh_experts() {
    at::NoGradGuard no_grad;
    const int64_t N = shards_;
    for (const auto &[begin, end] : blocks_) {
        // This shard's weights of the block, flat; the shards' come back in order.
        std::vector<at::Tensor> mine;
        for (size_t i = begin; i < end; ++i)
            if (weights_[i].shard == shard_) mine.push_back(weights_[i].tensor.reshape({-1}));
        const at::Tensor flat = at::cat(mine);
        at::Tensor all = at::empty({flat.numel() * N}, flat.options());
        experts_group_->all_gather(all, flat);
        int64_t offset = 0;
        for (int64_t s = 0; s < N; ++s)
            for (size_t i = begin; i < end; ++i) {
                if (weights_[i].shard != s) continue;
                at::Tensor &t = weights_[i].tensor;
                if (s != shard_) t.copy_(all.narrow(0, offset, t.numel()).view(t.sizes()));
                offset += t.numel();
            }
    }
}

std::vector<std::pair<std::string, ExpertParallel::State>>
ExpertParallel::gather_state(const std::function<State(const at::Tensor &weight)> &mine,
                             bool with_master) {
    at::NoGradGuard no_grad;
    std::vector<std::pair<std::string, State>> out;
    const int64_t N = shards_;
    for (const auto &[begin, end] : blocks_) {
        // Per owned weight: [step, exp_avg, exp_avg_sq, (master)] in float64.
        std::vector<at::Tensor> parts;
        for (size_t i = begin; i < end; ++i) {
            const Weight &w = weights_[i];
            if (w.shard != shard_) continue;
            const State st = mine(w.tensor);
            parts.push_back(at::full({1}, static_cast<double>(st.step), at::kDouble));
            for (const at::Tensor *t : {&st.exp_avg, &st.exp_avg_sq, &st.master}) {
                if (t == &st.master && !with_master) continue;
                parts.push_back(t->defined() ? t->to(at::kCPU).to(at::kDouble).reshape({-1})
                                             : at::zeros({w.tensor.numel()}, at::kDouble));
            }
        }
        const at::Tensor flat = at::cat(parts);
        at::Tensor all = at::empty({flat.numel() * N}, flat.options());
        experts_group_->all_gather(all, flat);
        int64_t offset = 0;
        for (int64_t s = 0; s < N; ++s)
            for (size_t i = begin; i < end; ++i) {
                const Weight &w = weights_[i];
                if (w.shard != s) continue;
                State st;
                st.step = static_cast<int64_t>(all[offset].item<double>());
                offset += 1;
                auto take = [&] {
                    at::Tensor t = all.narrow(0, offset, w.tensor.numel())
                                       .view(w.tensor.sizes())
                                       .to(at::kFloat);
                    offset += w.tensor.numel();
                    return t;
                };
                st.exp_avg = take();
                st.exp_avg_sq = take();
                if (with_master) st.master = take();
                if (st.step < 0) st.exp_avg = st.exp_avg_sq = at::Tensor();
                out.emplace_back(w.name, std::move(st));
            }
    }
    return out;
}

} // namespace rl::core
