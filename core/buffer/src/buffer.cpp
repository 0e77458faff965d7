// core/buffer/src/buffer.cpp: see rl/core/buffer.hpp and docs/buffer.md.
#include "rl/core/buffer.hpp"

#include "rl/core/error.hpp"
#include "rl/core/json.hpp"
#include "rl/core/names.hpp"
#include "rl/core/params.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace rl::core {

namespace {

constexpr DropReason kReasons[] = {DropReason::Stale, DropReason::TooSmall, DropReason::TooEasy,
                                   DropReason::TooHard, DropReason::ZeroVariance};

BufferStats empty_stats() {
    BufferStats s;
    for (DropReason r : kReasons) s.dropped[drop_reason_name(r)] = DropCount{};
    return s;
}

[[noreturn]] void bad(const std::string &msg) {
    throw Error(ErrorKind::InvalidArgument, msg);
}

double mean_reward_of(const std::vector<Rollout> &rs) {
    if (rs.empty()) return 0.0;
    double s = 0.0;
    for (const auto &r : rs) s += r.reward;
    return s / static_cast<double>(rs.size());
}

int64_t min_version_of(const std::vector<Rollout> &rs) {
    int64_t v = std::numeric_limits<int64_t>::max();
    for (const auto &r : rs) v = std::min(v, r.policy_version);
    return rs.empty() ? 0 : v;
}

constexpr Named<DropReason> kDropReasons[] = {{DropReason::Stale, "stale"},
                                              {DropReason::TooSmall, "too_small"},
                                              {DropReason::TooEasy, "too_easy"},
                                              {DropReason::TooHard, "too_hard"},
                                              {DropReason::ZeroVariance, "zero_variance"}};

} // namespace

const char *drop_reason_name(DropReason reason) {
    return name_in(kDropReasons, reason, "unknown");
}

double Group::mean_reward() const {
    return mean_reward_of(rollouts);
}
int64_t Group::min_policy_version() const {
    return min_version_of(rollouts);
}
size_t Group::n_tokens() const {
    size_t n = 0;
    for (const auto &r : rollouts) n += r.token_ids.size();
    return n;
}

int64_t BufferStats::dropped_rollouts() const {
    int64_t n = 0;
    for (const auto &kv : dropped) n += kv.second.rollouts;
    return n;
}
int64_t BufferStats::dropped_groups() const {
    int64_t n = 0;
    for (const auto &kv : dropped) n += kv.second.groups;
    return n;
}

BufferConfig BufferConfig::from_json(const std::string &text) {
    const nlohmann::json j = read_params_text(text, buffer_params(), "buffer", "buffer config");
    auto opt_number = [&](const char *k) {
        return j[k].is_null() ? std::nullopt : std::optional<double>(j[k].get<double>());
    };
    BufferConfig c;
    c.group_size = j["group_size"].get<size_t>();
    c.easy_threshold = opt_number("easy_threshold");
    c.hard_threshold = opt_number("hard_threshold");
    c.drop_zero_variance = j["drop_zero_variance"].get<bool>();
    c.reward_tolerance = j["reward_tolerance"].get<double>();
    c.min_group_size = j["min_group_size"].get<size_t>();
    c.max_off_policy_steps = j["max_off_policy_steps"].is_null()
                                 ? std::nullopt
                                 : std::optional<int64_t>(j["max_off_policy_steps"].get<int64_t>());
    c.drop_log_capacity = j["drop_log_capacity"].get<size_t>();
    c.validate();
    return c;
}

void BufferConfig::validate() const {
    auto finite = [](const std::optional<double> &x) { return !x || std::isfinite(*x); };
    if (!finite(easy_threshold)) bad("BufferConfig.easy_threshold must be finite");
    if (!finite(hard_threshold)) bad("BufferConfig.hard_threshold must be finite");
    if (easy_threshold && hard_threshold && !(*hard_threshold < *easy_threshold))
        bad("BufferConfig.hard_threshold (" + std::to_string(*hard_threshold) +
            ") must be below easy_threshold (" + std::to_string(*easy_threshold) +
            "), else every group is dropped");
    if (!std::isfinite(reward_tolerance) || reward_tolerance < 0.0)
        bad("BufferConfig.reward_tolerance must be finite and >= 0, got " +
            std::to_string(reward_tolerance));
    if (min_group_size < 1) bad("BufferConfig.min_group_size must be >= 1");
    if (max_off_policy_steps && *max_off_policy_steps < 0)
        bad("BufferConfig.max_off_policy_steps must be >= 0 (or unset), got " +
            std::to_string(*max_off_policy_steps));
    if (group_size > 0 && group_size < min_group_size)
        bad("BufferConfig.group_size (" + std::to_string(group_size) +
            ") is below min_group_size (" + std::to_string(min_group_size) +
            "): every group would be dropped");
}

RolloutBuffer::RolloutBuffer(BufferConfig config) : config_(std::move(config)) {
    config_.validate();
    total_ = empty_stats();
    interval_ = empty_stats();
}

// ---- version ------------------------------------------------------------------

void RolloutBuffer::set_policy_version(int64_t version) {
    std::lock_guard<std::mutex> lock(mu_);
    if (version < version_)
        bad("RolloutBuffer::set_policy_version: version " + std::to_string(version) +
            " is below the current " + std::to_string(version_) + "; versions never decrease");
    version_ = version;
    if (!config_.max_off_policy_steps) return;
    for (auto &kv : pending_) sweep_stale(kv.first, kv.second.rollouts);
    // Ready groups that lost rollouts are judged again; emptied ones are gone.
    std::deque<Group> kept;
    for (auto &g : ready_) {
        if (!sweep_stale(g.group_id, g.rollouts)) {
            kept.push_back(std::move(g));
            continue;
        }
        if (g.rollouts.empty()) {
            drop(g.group_id, DropReason::Stale, {}, true);
            continue;
        }
        if (auto reason = judge(g.rollouts)) {
            drop(g.group_id, *reason, g.rollouts, true);
            continue;
        }
        kept.push_back(std::move(g));
    }
    ready_.swap(kept);
}

int64_t RolloutBuffer::policy_version() const {
    std::lock_guard<std::mutex> lock(mu_);
    return version_;
}

// ---- push -----------------------------------------------------------------------

void RolloutBuffer::validate_rollout(const Rollout &r, const char *where) const {
    const std::string at = std::string("RolloutBuffer::") + where + ": rollout of group " +
                           std::to_string(r.group_id) + ": ";
    const size_t n = r.token_ids.size();
    if (n == 0) bad(at + "token_ids is empty");
    if (!r.logprobs.empty() && r.logprobs.size() != n)
        bad(at + "logprobs has " + std::to_string(r.logprobs.size()) + " entries, token_ids " +
            std::to_string(n));
    if (!r.loss_mask.empty() && r.loss_mask.size() != n)
        bad(at + "loss_mask has " + std::to_string(r.loss_mask.size()) + " entries, token_ids " +
            std::to_string(n));
    for (size_t t = 0; t < r.loss_mask.size(); ++t)
        if (r.loss_mask[t] > 1)
            bad(at + "loss_mask must hold 0 or 1, got " + std::to_string(r.loss_mask[t]) +
                " at token " + std::to_string(t));
    for (const auto &kv : r.extras) {
        if (kv.first.empty()) bad(at + "an extra per-token vector has an empty name");
        if (kv.second.size() != n)
            bad(at + "extra '" + kv.first + "' has " + std::to_string(kv.second.size()) +
                " entries, token_ids " + std::to_string(n));
    }
    if (!r.routed_experts.empty() || r.routed_layers != 0 || r.routed_k != 0) {
        if (r.routed_layers < 1 || r.routed_k < 1)
            bad(at + "routed_experts needs routed_layers and routed_k >= 1, got " +
                std::to_string(r.routed_layers) + " and " + std::to_string(r.routed_k));
        const size_t want = n * static_cast<size_t>(r.routed_layers * r.routed_k);
        if (r.routed_experts.size() != want)
            bad(at + "routed_experts has " + std::to_string(r.routed_experts.size()) +
                " ids, token_ids x routed_layers x routed_k = " + std::to_string(want));
    }
    if (!r.routed_expert_weights.empty()) {
        if (r.routed_expert_weights.size() != r.routed_experts.size())
            bad(at + "routed_expert_weights has " + std::to_string(r.routed_expert_weights.size()) +
                " weights, routed_experts " + std::to_string(r.routed_experts.size()) +
                " ids (the weights must have the layout of the ids they weigh)");
        for (size_t t = 0; t < r.routed_expert_weights.size(); ++t)
            if (!std::isfinite(r.routed_expert_weights[t]))
                bad(at + "routed_expert_weights holds " +
                    std::to_string(r.routed_expert_weights[t]) + " at value " + std::to_string(t) +
                    ", not a finite routing weight");
    }
    if (!std::isfinite(r.reward)) bad(at + "reward is not finite");
    if (r.policy_version < 0)
        bad(at + "policy_version must be >= 0, got " + std::to_string(r.policy_version));
    if (r.policy_version > version_)
        bad(at + "policy_version " + std::to_string(r.policy_version) +
            " is ahead of the buffer's current version " + std::to_string(version_) +
            "; call set_policy_version() when the trainer publishes new weights");
}

bool RolloutBuffer::is_stale(const Rollout &r) const {
    return config_.max_off_policy_steps &&
           version_ - r.policy_version > *config_.max_off_policy_steps;
}

void RolloutBuffer::expect_group(int64_t group_id, size_t size) {
    std::lock_guard<std::mutex> lock(mu_);
    if (size == 0)
        bad("RolloutBuffer::expect_group: group " + std::to_string(group_id) +
            " must expect at least one rollout");
    Pending &p = pending_[group_id];
    p.expected = size;
    if (p.arrived >= size) {
        Pending done = std::move(p);
        pending_.erase(group_id);
        complete(group_id, std::move(done.rollouts), done.arrived);
    }
}

void RolloutBuffer::push(Rollout rollout) {
    std::lock_guard<std::mutex> lock(mu_);
    validate_rollout(rollout, "push");
    const int64_t gid = rollout.group_id;
    auto it = pending_.find(gid);
    const size_t expected =
        it != pending_.end() && it->second.expected ? it->second.expected : config_.group_size;
    if (expected == 0)
        bad("RolloutBuffer::push: group " + std::to_string(gid) +
            " has no expected size; set BufferConfig.group_size, call expect_group(" +
            std::to_string(gid) + ", n) first, or use push_group()");
    Pending &p = it != pending_.end() ? it->second : pending_[gid];
    ++total_.pushed_rollouts;
    ++interval_.pushed_rollouts;
    ++p.arrived;
    if (is_stale(rollout))
        drop(gid, DropReason::Stale, {rollout}, false);
    else
        p.rollouts.push_back(std::move(rollout));
    if (p.arrived >= expected) {
        Pending done = std::move(p);
        pending_.erase(gid);
        complete(gid, std::move(done.rollouts), done.arrived);
    }
}

void RolloutBuffer::push_group(std::vector<Rollout> rollouts) {
    std::lock_guard<std::mutex> lock(mu_);
    if (rollouts.empty()) bad("RolloutBuffer::push_group: the group is empty");
    const int64_t gid = rollouts.front().group_id;
    for (const auto &r : rollouts) {
        if (r.group_id != gid)
            bad("RolloutBuffer::push_group: rollouts of groups " + std::to_string(gid) + " and " +
                std::to_string(r.group_id) + " in one call; a call holds exactly one group");
        validate_rollout(r, "push_group");
    }
    if (pending_.count(gid))
        bad("RolloutBuffer::push_group: group " + std::to_string(gid) +
            " is pending (being pushed one by one); finish it or close_group() it first");
    const size_t arrived = rollouts.size();
    total_.pushed_rollouts += static_cast<int64_t>(arrived);
    interval_.pushed_rollouts += static_cast<int64_t>(arrived);
    sweep_stale(gid, rollouts);
    complete(gid, std::move(rollouts), arrived);
}

bool RolloutBuffer::close_group(int64_t group_id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pending_.find(group_id);
    if (it == pending_.end()) return false;
    Pending done = std::move(it->second);
    pending_.erase(it);
    complete(group_id, std::move(done.rollouts), done.arrived);
    return true;
}

// ---- judging --------------------------------------------------------------------

std::optional<DropReason> RolloutBuffer::judge(const std::vector<Rollout> &rs) const {
    if (rs.size() < config_.min_group_size) return DropReason::TooSmall;
    const double mean = mean_reward_of(rs);
    if (config_.easy_threshold && mean >= *config_.easy_threshold) return DropReason::TooEasy;
    if (config_.hard_threshold && mean <= *config_.hard_threshold) return DropReason::TooHard;
    if (config_.drop_zero_variance && rs.size() >= 2) {
        double lo = rs.front().reward, hi = lo;
        for (const auto &r : rs) {
            lo = std::min(lo, r.reward);
            hi = std::max(hi, r.reward);
        }
        if (hi - lo <= config_.reward_tolerance) return DropReason::ZeroVariance;
    }
    return std::nullopt;
}

void RolloutBuffer::complete(int64_t group_id, std::vector<Rollout> rollouts, size_t arrived) {
    ++total_.completed_groups;
    ++interval_.completed_groups;
    if (rollouts.empty()) {
        // Every rollout went stale (already counted), or none ever arrived.
        const DropReason reason = arrived > 0 ? DropReason::Stale : DropReason::TooSmall;
        drop(group_id, reason, {}, true);
        return;
    }
    if (auto reason = judge(rollouts)) {
        drop(group_id, *reason, rollouts, true);
        return;
    }
    ++total_.ready_groups;
    ++interval_.ready_groups;
    ready_.push_back(Group{group_id, std::move(rollouts)});
    cv_.notify_all();
}

void RolloutBuffer::drop(int64_t group_id, DropReason reason, const std::vector<Rollout> &removed,
                         bool whole_group) {
    const char *name = drop_reason_name(reason);
    for (BufferStats *s : {&total_, &interval_}) {
        DropCount &c = s->dropped[name];
        c.rollouts += static_cast<int64_t>(removed.size());
        if (whole_group) ++c.groups;
    }
    if (removed.empty() && reason == DropReason::Stale) return; // rollouts were logged already
    if (config_.drop_log_capacity == 0) return;
    DropRecord rec;
    rec.group_id = group_id;
    rec.reason = reason;
    rec.rollouts = removed.size();
    rec.mean_reward = mean_reward_of(removed);
    rec.policy_version = min_version_of(removed);
    rec.current_version = version_;
    log_.push_back(rec);
    while (log_.size() > config_.drop_log_capacity) log_.pop_front();
}

bool RolloutBuffer::sweep_stale(int64_t group_id, std::vector<Rollout> &rollouts) {
    std::vector<Rollout> stale, fresh;
    for (auto &r : rollouts) (is_stale(r) ? stale : fresh).push_back(std::move(r));
    rollouts.swap(fresh);
    if (stale.empty()) return false;
    drop(group_id, DropReason::Stale, stale, false);
    return true;
}

// ---- pop --------------------------------------------------------------------------

size_t RolloutBuffer::ready_rollouts_locked() const {
    size_t n = 0;
    for (const auto &g : ready_) n += g.rollouts.size();
    return n;
}

size_t RolloutBuffer::ready_groups() const {
    std::lock_guard<std::mutex> lock(mu_);
    return ready_.size();
}
size_t RolloutBuffer::ready_rollouts() const {
    std::lock_guard<std::mutex> lock(mu_);
    return ready_rollouts_locked();
}
size_t RolloutBuffer::pending_groups() const {
    std::lock_guard<std::mutex> lock(mu_);
    return pending_.size();
}
size_t RolloutBuffer::pending_rollouts() const {
    std::lock_guard<std::mutex> lock(mu_);
    size_t n = 0;
    for (const auto &kv : pending_) n += kv.second.rollouts.size();
    return n;
}

std::vector<Group> RolloutBuffer::pop_groups(size_t max_groups) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<Group> out;
    while (!ready_.empty() && out.size() < max_groups) {
        out.push_back(std::move(ready_.front()));
        ready_.pop_front();
    }
    for (BufferStats *s : {&total_, &interval_}) {
        s->popped_groups += static_cast<int64_t>(out.size());
        for (const auto &g : out) s->popped_rollouts += static_cast<int64_t>(g.rollouts.size());
    }
    return out;
}

std::vector<Group> RolloutBuffer::pop_batch_locked(size_t min_rollouts) {
    std::vector<Group> out;
    if (ready_rollouts_locked() < min_rollouts) return out;
    size_t got = 0;
    while (got < min_rollouts) {
        got += ready_.front().rollouts.size();
        out.push_back(std::move(ready_.front()));
        ready_.pop_front();
    }
    for (BufferStats *s : {&total_, &interval_}) {
        s->popped_groups += static_cast<int64_t>(out.size());
        s->popped_rollouts += static_cast<int64_t>(got);
    }
    return out;
}

std::vector<Group> RolloutBuffer::pop_batch(size_t min_rollouts) {
    if (min_rollouts == 0) bad("RolloutBuffer::pop_batch: min_rollouts must be >= 1");
    std::lock_guard<std::mutex> lock(mu_);
    return pop_batch_locked(min_rollouts);
}

std::vector<Group> RolloutBuffer::wait_batch(size_t min_rollouts,
                                             std::chrono::milliseconds timeout) {
    if (min_rollouts == 0) bad("RolloutBuffer::wait_batch: min_rollouts must be >= 1");
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return ready_rollouts_locked() >= min_rollouts; });
    return pop_batch_locked(min_rollouts);
}

std::vector<Group> RolloutBuffer::pop_ready(size_t min_rollouts,
                                            std::chrono::milliseconds timeout) {
    if (min_rollouts == 0) bad("RolloutBuffer::pop_ready: min_rollouts must be >= 1");
    std::unique_lock<std::mutex> lock(mu_);
    if (timeout.count() > 0)
        cv_.wait_for(lock, timeout, [&] { return ready_rollouts_locked() >= min_rollouts; });
    const size_t ready = ready_rollouts_locked();
    if (ready < min_rollouts) return {};
    return pop_batch_locked(ready);
}

size_t RolloutBuffer::wait_ready(size_t min_rollouts, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    if (timeout.count() > 0)
        cv_.wait_for(lock, timeout, [&] { return ready_rollouts_locked() >= min_rollouts; });
    return ready_rollouts_locked();
}

// ---- reporting ----------------------------------------------------------------------

BufferStats RolloutBuffer::stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return total_;
}

BufferStats RolloutBuffer::take_stats() {
    std::lock_guard<std::mutex> lock(mu_);
    BufferStats out = interval_;
    interval_ = empty_stats();
    return out;
}

std::vector<DropRecord> RolloutBuffer::take_drop_log() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<DropRecord> out(log_.begin(), log_.end());
    log_.clear();
    return out;
}

// ---- state ------------------------------------------------------------------------------

namespace {

using json = nlohmann::json;

constexpr const char *kStateFormat = "rl.buffer_state/1";

json rollout_state(const Rollout &r) {
    json j = {{"group_id", r.group_id},    {"policy_version", r.policy_version},
              {"reward", r.reward},        {"token_ids", r.token_ids},
              {"logprobs", r.logprobs},    {"loss_mask", r.loss_mask},
              {"extras", r.extras},        {"task", r.task},
              {"completion", r.completion}};
    if (r.sampling_temperature) j["sampling_temperature"] = *r.sampling_temperature;
    if (!r.routed_experts.empty())
        j["routed_experts"] = {
            {"layers", r.routed_layers}, {"k", r.routed_k}, {"ids", r.routed_experts}};
    if (!r.routed_expert_weights.empty()) j["routed_experts"]["weights"] = r.routed_expert_weights;
    return j;
}

json stats_state(const BufferStats &s) {
    json dropped = json::object();
    for (const auto &[name, c] : s.dropped) dropped[name] = {c.groups, c.rollouts};
    return {{"pushed_rollouts", s.pushed_rollouts}, {"completed_groups", s.completed_groups},
            {"ready_groups", s.ready_groups},       {"popped_groups", s.popped_groups},
            {"popped_rollouts", s.popped_rollouts}, {"dropped", dropped}};
}

// Reads fields of one object of the state, naming `where` in errors.
struct StateReader {
    const json &j;
    std::string where;

    const json &at(const char *key) const {
        if (!j.is_object() || !j.contains(key)) bad(where + ": '" + key + "' is missing");
        return j[key];
    }
    template <class T>
    T get(const char *key) const {
        try {
            return at(key).get<T>();
        } catch (const json::exception &) {
            bad(where + "." + key + " has the wrong type (" + at(key).type_name() + ")");
        }
    }
};

Rollout rollout_from_state(const json &j, const std::string &where) {
    const StateReader f{j, where};
    Rollout r;
    r.group_id = f.get<int64_t>("group_id");
    r.policy_version = f.get<int64_t>("policy_version");
    r.reward = f.get<double>("reward");
    r.token_ids = f.get<std::vector<int64_t>>("token_ids");
    r.logprobs = f.get<std::vector<float>>("logprobs");
    r.loss_mask = f.get<std::vector<uint8_t>>("loss_mask");
    r.extras = f.get<std::map<std::string, std::vector<float>>>("extras");
    r.task = f.get<std::string>("task");
    r.completion = f.get<std::string>("completion");
    if (j.contains("sampling_temperature"))
        r.sampling_temperature = f.get<double>("sampling_temperature");
    if (j.contains("routed_experts")) {
        const StateReader g{f.at("routed_experts"), where + ".routed_experts"};
        r.routed_layers = g.get<int64_t>("layers");
        r.routed_k = g.get<int64_t>("k");
        r.routed_experts = g.get<std::vector<int32_t>>("ids");
        if (g.j.contains("weights")) r.routed_expert_weights = g.get<std::vector<float>>("weights");
    }
    return r;
}

// The rollouts of one group of the state (a ready group holds at least one).
std::vector<Rollout> rollouts_from_state(const json &rs, const std::string &where, bool non_empty) {
    if (!rs.is_array() || (non_empty && rs.empty()))
        bad(where + (non_empty ? " must be a non-empty list" : " must be a list"));
    std::vector<Rollout> out;
    for (size_t k = 0; k < rs.size(); ++k)
        out.push_back(rollout_from_state(rs[k], where + "[" + std::to_string(k) + "]"));
    return out;
}

BufferStats stats_from_state(const json &j, const std::string &where) {
    const StateReader f{j, where};
    BufferStats s = empty_stats();
    s.pushed_rollouts = f.get<int64_t>("pushed_rollouts");
    s.completed_groups = f.get<int64_t>("completed_groups");
    s.ready_groups = f.get<int64_t>("ready_groups");
    s.popped_groups = f.get<int64_t>("popped_groups");
    s.popped_rollouts = f.get<int64_t>("popped_rollouts");
    const auto dropped = f.get<std::map<std::string, std::pair<int64_t, int64_t>>>("dropped");
    for (const auto &[name, c] : dropped) {
        if (!s.dropped.count(name)) bad(where + ".dropped: unknown reason '" + name + "'");
        s.dropped[name] = DropCount{c.first, c.second};
    }
    return s;
}

} // namespace

std::string RolloutBuffer::state_json() const {
    std::lock_guard<std::mutex> lock(mu_);
    json pending = json::array();
    // Sorted by group id: the same holdings give the same text.
    std::vector<int64_t> ids;
    for (const auto &kv : pending_) ids.push_back(kv.first);
    std::sort(ids.begin(), ids.end());
    for (int64_t id : ids) {
        const Pending &p = pending_.at(id);
        json rs = json::array();
        for (const auto &r : p.rollouts) rs.push_back(rollout_state(r));
        pending.push_back(
            {{"group_id", id}, {"arrived", p.arrived}, {"expected", p.expected}, {"rollouts", rs}});
    }
    json ready = json::array();
    for (const auto &g : ready_) {
        json rs = json::array();
        for (const auto &r : g.rollouts) rs.push_back(rollout_state(r));
        ready.push_back({{"group_id", g.group_id}, {"rollouts", rs}});
    }
    json log = json::array();
    for (const auto &d : log_)
        log.push_back({{"group_id", d.group_id},
                       {"reason", drop_reason_name(d.reason)},
                       {"rollouts", d.rollouts},
                       {"mean_reward", d.mean_reward},
                       {"policy_version", d.policy_version},
                       {"current_version", d.current_version}});
    const json state = {{"format", kStateFormat},
                        {"policy_version", version_},
                        {"pending", pending},
                        {"ready", ready},
                        {"total", stats_state(total_)},
                        {"interval", stats_state(interval_)},
                        {"drop_log", log}};
    // Texts of rollouts are UTF-8 by the time they are pushed; replace keeps
    // a state with a stray byte writable rather than losing it all.
    return state.dump(-1, ' ', false, json::error_handler_t::replace);
}

void RolloutBuffer::restore(const std::string &state_text, const std::string &source) {
    const json j = parse_json(state_text, source);
    const StateReader top{j, source};
    if (top.get<std::string>("format") != kStateFormat)
        bad(source + ": not a " + kStateFormat + " state (format '" +
            top.get<std::string>("format") + "')");
    // Everything is read and checked before the buffer changes.
    std::unordered_map<int64_t, Pending> pending;
    std::deque<Group> ready;
    const json &pj = top.at("pending");
    if (!pj.is_array()) bad(source + ".pending must be a list");
    for (size_t i = 0; i < pj.size(); ++i) {
        const std::string where = source + ".pending[" + std::to_string(i) + "]";
        const StateReader f{pj[i], where};
        Pending p;
        p.arrived = f.get<size_t>("arrived");
        p.expected = f.get<size_t>("expected");
        p.rollouts = rollouts_from_state(f.at("rollouts"), where + ".rollouts", false);
        if (!pending.emplace(f.get<int64_t>("group_id"), std::move(p)).second)
            bad(where + ": group " + std::to_string(f.get<int64_t>("group_id")) + " twice");
    }
    const json &rj = top.at("ready");
    if (!rj.is_array()) bad(source + ".ready must be a list");
    for (size_t i = 0; i < rj.size(); ++i) {
        const std::string where = source + ".ready[" + std::to_string(i) + "]";
        const StateReader f{rj[i], where};
        Group g;
        g.group_id = f.get<int64_t>("group_id");
        g.rollouts = rollouts_from_state(f.at("rollouts"), where + ".rollouts", true);
        ready.push_back(std::move(g));
    }
    std::deque<DropRecord> log;
    const json &lj = top.at("drop_log");
    if (!lj.is_array()) bad(source + ".drop_log must be a list");
    for (size_t i = 0; i < lj.size(); ++i) {
        const StateReader f{lj[i], source + ".drop_log[" + std::to_string(i) + "]"};
        DropRecord d;
        d.group_id = f.get<int64_t>("group_id");
        const std::string reason = f.get<std::string>("reason");
        bool known = false;
        for (DropReason r : kReasons)
            if (reason == drop_reason_name(r)) d.reason = r, known = true;
        if (!known) bad(f.where + ".reason: unknown reason '" + reason + "'");
        d.rollouts = f.get<size_t>("rollouts");
        d.mean_reward = f.get<double>("mean_reward");
        d.policy_version = f.get<int64_t>("policy_version");
        d.current_version = f.get<int64_t>("current_version");
        log.push_back(d);
    }
    const BufferStats total = stats_from_state(top.at("total"), source + ".total");
    const BufferStats interval = stats_from_state(top.at("interval"), source + ".interval");
    const int64_t version = top.get<int64_t>("policy_version");

    std::lock_guard<std::mutex> lock(mu_);
    if (!pending_.empty() || !ready_.empty() || total_.pushed_rollouts != 0)
        bad(source + ": a state is restored into a new buffer only (this one took rollouts)");
    const int64_t own_version = version_;
    version_ = version; // the rollouts are checked against the saved version
    try {
        for (const auto &kv : pending)
            for (const auto &r : kv.second.rollouts) validate_rollout(r, "restore");
        for (const auto &g : ready)
            for (const auto &r : g.rollouts) validate_rollout(r, "restore");
    } catch (...) {
        version_ = own_version;
        throw;
    }
    pending_ = std::move(pending);
    ready_ = std::move(ready);
    total_ = total;
    interval_ = interval;
    log_ = std::move(log);
    cv_.notify_all();
}

} // namespace rl::core
