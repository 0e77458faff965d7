// tests/peers: the peer reference vectors (vectors/<peer>/<function>.json,
// written by generate.py from the peers' own functions at pinned commits)
// mapped onto our loss and advantage plugins under the parameter mapping that
// docs/losses.md and docs/advantages.md state ("Coming from verl / AReaL /
// prime-rl"), compared with |ours - peer| <= 1e-5 + 1e-5 |peer| for the loss,
// d loss / d logprobs, the mapped metrics, advantages and returns.
//
// Where we differ from the peer on purpose, the check names the difference
// and the docs line that states it, and compares the rest strictly with that
// difference removed (a rescaled normalizer, the rows it does not touch, or
// the peer's reduction applied to our per-token outputs).
#include "../losses/loss_run_once.hpp"
#include "causallm_loss/causallm_loss.hpp"
#include "cispo/cispo.hpp"
#include "clip_cov/clip_cov.hpp"
#include "decoupled_ppo/decoupled_ppo.hpp"
#include "dl_plugin_host.hpp"
#include "dppo/dppo.hpp"
#include "gmpo/gmpo.hpp"
#include "gspo/gspo.hpp"
#include "importance_sampling/importance_sampling.hpp"
#include "ipo/ipo.hpp"
#include "kl_cov/kl_cov.hpp"
#include "policy_loss/policy_loss.hpp"
#include "sapo/sapo.hpp"
#include "value_loss/value_loss.hpp"

#include <rl/sdk/testing.hpp>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

namespace T = rl::sdk::testing;
namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr double kAbsTol = 1e-5;
constexpr double kRelTol = 1e-5;

bool close(double ours, double peer) {
    return std::fabs(ours - peer) <= kAbsTol + kRelTol * std::fabs(peer);
}

std::string fmt(double x) {
    std::ostringstream s;
    s.precision(17);
    s << x;
    return s.str();
}

// Says that a check takes a documented, deliberate difference into account.
void deliberate(const std::string &where, const std::string &what) {
    std::cout << "[ deliberate ] " << where << ": " << what << "\n";
}

// ---- reading vector files ---------------------------------------------------------------

fs::path vectors_dir() {
    return fs::path(RL_TEST_SOURCE_DIR) / "tests" / "peers" / "vectors";
}

const json &require(const json &obj, const std::string &key, const std::string &where) {
    if (!obj.is_object() || !obj.contains(key))
        throw std::runtime_error(where + ": missing key '" + key + "'");
    return obj.at(key);
}

// A vector file, parsed and checked for the keys every file has; throws
// std::runtime_error naming the file and what is wrong.
json read_vector_file(const fs::path &path) {
    std::ifstream f(path);
    if (!f) throw std::runtime_error(path.string() + ": cannot be opened");
    json doc;
    try {
        doc = json::parse(f);
    } catch (const json::exception &e) {
        throw std::runtime_error(path.string() + ": not valid JSON: " + e.what());
    }
    const std::string where = path.string();
    for (const char *key : {"peer", "repo", "commit", "function"})
        if (!require(doc, key, where).is_string())
            throw std::runtime_error(where + ": '" + key + "' is not a string");
    const json &cases = require(doc, "cases", where);
    if (!cases.is_array() || cases.empty())
        throw std::runtime_error(where + ": 'cases' is not a non-empty array");
    for (size_t i = 0; i < cases.size(); ++i) {
        const std::string w = where + ": case " + std::to_string(i);
        if (!require(cases[i], "name", w).is_string())
            throw std::runtime_error(w + ": 'name' is not a string");
        for (const char *key : {"parameters", "inputs", "outputs"})
            if (!require(cases[i], key, w).is_object())
                throw std::runtime_error(w + ": '" + key + "' is not an object");
    }
    return doc;
}

std::vector<double> vec(const json &x, const std::string &what) {
    if (!x.is_array()) throw std::runtime_error(what + " is not an array");
    std::vector<double> v;
    for (const auto &e : x) {
        if (e.is_boolean())
            v.push_back(e.get<bool>() ? 1.0 : 0.0);
        else if (e.is_number())
            v.push_back(e.get<double>());
        else
            throw std::runtime_error(what + " holds a non-number");
    }
    return v;
}

// Rows of a padded [batch, response_length] tensor, flattened row by row.
std::vector<double> flat(const json &rows, const std::string &what, int64_t *B = nullptr,
                         int64_t *L = nullptr) {
    if (!rows.is_array() || rows.empty()) throw std::runtime_error(what + " has no rows");
    std::vector<double> v;
    const size_t width = rows[0].size();
    for (const auto &row : rows) {
        if (row.size() != width) throw std::runtime_error(what + ": rows of unequal length");
        const auto r = vec(row, what);
        v.insert(v.end(), r.begin(), r.end());
    }
    if (B) *B = static_cast<int64_t>(rows.size());
    if (L) *L = static_cast<int64_t>(width);
    return v;
}

// ---- comparing ----------------------------------------------------------------------

void expect_close(const std::string &where, const std::string &what, double ours, double peer) {
    EXPECT_TRUE(close(ours, peer))
        << where << ": " << what << ": ours " << fmt(ours) << ", peer " << fmt(peer);
}

// Element-wise, where `keep` (when given) is non-zero.
void expect_close(const std::string &where, const std::string &what,
                  const std::vector<double> &ours, const std::vector<double> &peer,
                  const std::vector<double> &keep = {}) {
    ASSERT_EQ(ours.size(), peer.size()) << where << ": " << what << ": lengths differ";
    int bad = 0;
    for (size_t i = 0; i < ours.size(); ++i) {
        if (!keep.empty() && keep[i] == 0) continue;
        if (!close(ours[i], peer[i]) && bad++ < 5)
            ADD_FAILURE() << where << ": " << what << "[" << i << "]: ours " << fmt(ours[i])
                          << ", peer " << fmt(peer[i]);
    }
    EXPECT_EQ(bad, 0) << where << ": " << what << ": " << bad << " elements differ";
}

// ---- running our losses -----------------------------------------------------------------

using rl::losses::test::run_once;

T::LossRun run_loss(const std::string &loss, const json &params, const T::LossInputs &in) {
    const std::string p = params.dump();
    if (loss == "policy_loss") return run_once<rl::losses::PolicyLoss>(p, in);
    if (loss == "importance_sampling") return run_once<rl::losses::ImportanceSampling>(p, in);
    if (loss == "gspo") return run_once<rl::losses::Gspo>(p, in);
    if (loss == "gmpo") return run_once<rl::losses::Gmpo>(p, in);
    if (loss == "sapo") return run_once<rl::losses::Sapo>(p, in);
    if (loss == "clip_cov") return run_once<rl::losses::ClipCov>(p, in);
    if (loss == "kl_cov") return run_once<rl::losses::KlCov>(p, in);
    if (loss == "cispo") return run_once<rl::losses::Cispo>(p, in);
    if (loss == "decoupled_ppo") return run_once<rl::losses::DecoupledPpo>(p, in);
    if (loss == "dppo") return run_once<rl::losses::Dppo>(p, in);
    if (loss == "ipo") return run_once<rl::losses::Ipo>(p, in);
    if (loss == "value_loss") return run_once<rl::losses::ValueLoss>(p, in);
    if (loss == "causallm_loss") return run_once<rl::losses::CausalLmLoss>(p, in);
    throw std::invalid_argument("the test maps no peer function onto loss '" + loss + "'");
}

T::LossRun run_ok(const std::string &where, const std::string &loss, const json &p,
                  const T::LossInputs &in) {
    T::LossRun run = run_loss(loss, p, in);
    EXPECT_EQ(run.status, RL_OK) << where << ": " << loss << " " << p.dump() << ": " << run.error;
    return run;
}

// The run's loss and d loss / d logprobs against the vector's outputs (loss,
// grad_logprobs).
void expect_loss_and_grad(const std::string &where, const T::LossRun &run, const json &out) {
    expect_close(where, "loss", run.loss, out["loss"].get<double>());
    expect_close(where, "d loss / d logprobs", run.grads.at("logprobs"),
                 flat(out["grad_logprobs"], "grad_logprobs"));
}

// ---- verl's policy losses (padded rows become packed sequences) -------------------------

struct Rows {
    int64_t B = 0, L = 0, S = 0; // rows, row width, rows with loss tokens
    std::vector<double> mask;
    T::LossInputs in;
};

Rows verl_rows(const json &inputs, const std::string &where) {
    Rows r;
    const auto lp = flat(require(inputs, "log_prob", where), "log_prob", &r.B, &r.L);
    r.mask = flat(require(inputs, "response_mask", where), "response_mask");
    std::vector<int64_t> cu = {0};
    for (int64_t i = 0; i < r.B; ++i) {
        cu.push_back(cu.back() + r.L);
        double n = 0;
        for (int64_t t = i * r.L; t < (i + 1) * r.L; ++t) n += r.mask[size_t(t)];
        r.S += n > 0;
    }
    r.in.f64("logprobs", lp).f64("loss_mask", r.mask).cu_seqlens(cu);
    const std::vector<double> zeros(lp.size(), 0.0);
    r.in.f64("old_logprobs",
             inputs.contains("old_log_prob") ? flat(inputs["old_log_prob"], "old_log_prob") : lp);
    r.in.f64("advantages",
             inputs.contains("advantages") ? flat(inputs["advantages"], "advantages") : zeros);
    if (inputs.contains("rollout_is_weights"))
        r.in.f64("rollout_is_weights", flat(inputs["rollout_is_weights"], "rollout_is_weights"));
    if (inputs.contains("ref_log_prob"))
        r.in.f64("ref_logprobs", flat(inputs["ref_log_prob"], "ref_log_prob"));
    return r;
}

using MetricMap = std::vector<std::pair<std::string, std::function<double(const json &)>>>;

std::function<double(const json &)> peer_metric(const std::string &name) {
    return [name](const json &m) { return require(m, name, "peer metrics").get<double>(); };
}

// Runs `loss` with `params` on the case's rows; the loss and the gradient are
// compared after multiplying ours by `scale` (1 unless a deliberate
// difference of normalizer is removed), the metrics as mapped.
T::LossRun check_verl_loss(const json &c, const std::string &where, const std::string &loss,
                           const json &params, const MetricMap &metrics, double scale = 1.0) {
    Rows r = verl_rows(c["inputs"], where);
    T::LossRun run = run_loss(loss, params, r.in);
    EXPECT_EQ(run.status, RL_OK) << where << ": " << loss << " " << params.dump() << ": "
                                 << run.error;
    if (run.status != RL_OK) return run;
    const json &out = c["outputs"];
    expect_close(where, "loss", scale * run.loss, out["loss"].get<double>());
    std::vector<double> g = run.grads.at("logprobs");
    for (auto &x : g) x *= scale;
    expect_close(where, "d loss / d log_prob", g, flat(out["grad_log_prob"], "grad_log_prob"));
    for (const auto &m : metrics) {
        if (!run.has_metric(m.first)) {
            ADD_FAILURE() << where << ": our loss emitted no metric '" << m.first << "'";
            continue;
        }
        expect_close(where, "metric " + m.first, run.metric(m.first), m.second(out["metrics"]));
    }
    return run;
}

double param(const json &c, const std::string &key) {
    return c["parameters"].at(key).get<double>();
}

void verl_vanilla(const json &c, const std::string &where) {
    const json p = {{"eps_clip", param(c, "clip_ratio_low")},
                    {"eps_clip_high", param(c, "clip_ratio_high")},
                    {"eps_clip_c", param(c, "clip_ratio_c")},
                    {"loss_agg_mode", c["parameters"]["loss_agg_mode"]}};
    // our pg_clipfrac counts clip and dual clip (disjoint sets of tokens); verl
    // reports them as pg_clipfrac and pg_clipfrac_lower
    check_verl_loss(c, where, "policy_loss", p,
                    {{"pg_clipfrac", [](const json &m) {
                          return m.at("pg_clipfrac").get<double>() +
                                 m.at("pg_clipfrac_lower").get<double>();
                      }}});
}

// verl's rollout correction before the vanilla loss: token TIS weights
// (compute_rollout_correction_weights) and token rejection masks
// (compute_rollout_rejection_mask, which verl applies to response_mask), as
// our rejection_sampling against rollout_logprobs.
void verl_rollout_correction(const json &c, const std::string &where) {
    const json &pp = c["parameters"];
    json rs;
    if (pp.contains("rollout_is")) {
        if (pp["rollout_is"] != "token")
            throw std::runtime_error(where + ": only token-level rollout_is maps onto "
                                             "rejection_sampling (sequence: rollout_is_weights)");
        rs = {{"level", "token"},
              {"action", "clamp"},
              {"metric", "ratio"},
              {"upper", pp.at("rollout_is_threshold")}};
    } else {
        const std::string opt = pp.at("rollout_rs");
        const json &spec = pp.at("rollout_rs_threshold");
        if (opt == "token_k1") {
            // verl keeps -log_ratio in [log lower, log upper] (lower = 1 / upper
            // when one value is given): our ratio exp(log_ratio) in
            // [1 / upper, 1 / lower]
            double lo = 0, up = 0;
            if (spec.is_string()) {
                const std::string t = spec;
                const auto cut = t.find('_');
                lo = std::stod(t.substr(0, cut));
                up = std::stod(t.substr(cut + 1));
            } else {
                up = spec.get<double>();
                lo = 1.0 / up;
            }
            rs = {{"level", "token"},
                  {"action", "mask"},
                  {"metric", "ratio"},
                  {"lower", 1.0 / up},
                  {"upper", 1.0 / lo}};
        } else if (opt == "token_k2") {
            rs = {{"level", "token"}, {"action", "mask"}, {"metric", "kl_k2"}, {"upper", spec}};
        } else {
            throw std::runtime_error(where + ": no rejection_sampling form for rollout_rs '" + opt +
                                     "'");
        }
    }
    const json p = {{"eps_clip", param(c, "clip_ratio_low")},
                    {"eps_clip_high", param(c, "clip_ratio_high")},
                    {"eps_clip_c", param(c, "clip_ratio_c")},
                    {"loss_agg_mode", "token-mean"},
                    {"per_token_outputs", true},
                    {"rejection_sampling", rs}};
    Rows r = verl_rows(c["inputs"], where);
    r.in.f64("rollout_logprobs", flat(require(c["inputs"], "rollout_log_prob", where), "rollout"));
    const T::LossRun run = run_loss("policy_loss", p, r.in);
    ASSERT_EQ(run.status, RL_OK) << where << ": " << p.dump() << ": " << run.error;
    const json &out = c["outputs"];
    const auto after = flat(out["response_mask_after"], "response_mask_after");
    const auto &rej = run.tensors.at("rejection_mask");
    double kept = 0, tokens = 0;
    std::vector<double> ours_after(after.size());
    for (size_t t = 0; t < after.size(); ++t) {
        ours_after[t] = r.mask[t] * (1.0 - rej[t]);
        kept += ours_after[t];
        tokens += r.mask[t];
    }
    expect_close(where, "tokens kept", ours_after, after);
    double scale = 1.0;
    if (kept != tokens) {
        scale = tokens / kept;
        deliberate(where, "verl drops rejected tokens from response_mask, so from the token-mean "
                          "normalizer; ours keeps them there (docs/losses.md, \"Rejection "
                          "sampling on every policy loss\": \"rejected tokens stay in the "
                          "normalizer\"); compared as ours * tokens / kept");
    }
    expect_close(where, "loss", scale * run.loss, out["loss"].get<double>());
    std::vector<double> g = run.grads.at("logprobs");
    for (auto &x : g) x *= scale;
    expect_close(where, "d loss / d log_prob", g, flat(out["grad_log_prob"], "grad_log_prob"));
    if (kept == tokens)
        expect_close(where, "metric pg_clipfrac", run.metric("pg_clipfrac"),
                     out["metrics"]["pg_clipfrac"].get<double>() +
                         out["metrics"]["pg_clipfrac_lower"].get<double>());
}

void verl_agg_loss(const json &c, const std::string &where) {
    const std::string mode = c["parameters"].at("loss_agg_mode");
    if (c["parameters"].at("loss_mat") != "-advantages * exp(log_prob - old_log_prob)")
        throw std::runtime_error(where + ": agg_loss over an unknown loss_mat");
    Rows r = verl_rows(c["inputs"], where);
    json p = {{"loss_agg_mode", mode}};
    double scale = 1.0;
    if (mode == "seq-mean-token-sum-norm") {
        p["max_seq_len"] = r.L; // verl's default loss_scale_factor: the padded width
        scale = double(r.S);
        deliberate(where, "verl's seq-mean-token-sum-norm divides by the horizon only, ours by "
                          "S * max_seq_len (docs/losses.md, \"Aggregation\": \"verl's "
                          "seq-mean-token-sum-norm divides by the horizon only (no 1/S)\"); "
                          "compared as ours * S");
    }
    check_verl_loss(c, where, "importance_sampling", p, {}, scale);
}

void verl_gspo(const json &c, const std::string &where) {
    const json p = {{"eps_clip", param(c, "clip_ratio_low")},
                    {"eps_clip_high", param(c, "clip_ratio_high")},
                    {"loss_agg_mode", "seq-mean-token-mean"}};
    const Rows r = verl_rows(c["inputs"], where);
    // whether a per-token input varies within a sequence's loss tokens
    const auto varies = [&](const char *name) {
        if (!c["inputs"].contains(name)) return false;
        const auto x = flat(c["inputs"][name], name);
        for (int64_t i = 0; i < r.B; ++i) {
            double first = NAN;
            for (int64_t t = i * r.L; t < (i + 1) * r.L; ++t) {
                if (r.mask[size_t(t)] == 0) continue;
                if (std::isnan(first)) first = x[size_t(t)];
                if (x[size_t(t)] != first) return true;
            }
        }
        return false;
    };
    const bool per_token = varies("advantages") || varies("rollout_is_weights");
    if (!per_token) {
        check_verl_loss(c, where, "gspo", p, {{"pg_clipfrac", peer_metric("pg_clipfrac")}});
        return;
    }
    // Per-token advantages or rollout weights: verl's GSPO-token
    // stop-gradient form gives token u the gradient of its own term only, ours
    // the exact derivative spread over the sequence (docs/losses.md, `gspo`).
    // Value and clip fraction are the same; so is the gradient's sum over
    // each sequence.
    deliberate(where, "per-token advantages or rollout_is_weights: the gradient compared as "
                      "its sum over each sequence (docs/losses.md, `gspo`: \"with per-token "
                      "advantages the two differ\")");
    T::LossInputs in = r.in;
    const T::LossRun run = run_loss("gspo", p, in);
    ASSERT_EQ(run.status, RL_OK) << where << ": " << run.error;
    const json &out = c["outputs"];
    expect_close(where, "loss", run.loss, out["loss"].get<double>());
    expect_close(where, "metric pg_clipfrac", run.metric("pg_clipfrac"),
                 out["metrics"]["pg_clipfrac"].get<double>());
    const auto peer_g = flat(out["grad_log_prob"], "grad_log_prob");
    const auto &ours_g = run.grads.at("logprobs");
    std::vector<double> ours_sum, peer_sum;
    for (int64_t i = 0; i < r.B; ++i) {
        double a = 0, b = 0;
        for (int64_t t = i * r.L; t < (i + 1) * r.L; ++t) {
            a += ours_g[size_t(t)];
            b += peer_g[size_t(t)];
        }
        ours_sum.push_back(a);
        peer_sum.push_back(b);
    }
    expect_close(where, "per-sequence sum of d loss / d log_prob", ours_sum, peer_sum);
}

void verl_geo_mean(const json &c, const std::string &where) {
    const json p = {{"eps_clip", param(c, "clip_ratio_low")},
                    {"eps_clip_high", param(c, "clip_ratio_high")},
                    {"loss_agg_mode", "seq-mean-token-mean"}};
    const Rows r = verl_rows(c["inputs"], where);
    double scale = 1.0;
    if (r.S != r.B) {
        scale = double(r.S) / double(r.B);
        deliberate(where, "verl's geo_mean takes torch.mean over every row, " +
                              std::to_string(r.B - r.S) +
                              " empty row(s) included; ours averages over the sequences with "
                              "loss tokens (docs/losses.md, `gmpo`, \"Difference from verl\"); "
                              "compared as ours * S / B");
    }
    // verl's pg_clipfrac / _lower count tokens outside the band by advantage
    // sign, ours the tokens whose clipped branch was taken: not mapped
    // (docs/losses.md, `gmpo`).
    check_verl_loss(c, where, "gmpo", p, {}, scale);
}

void verl_sapo(const json &c, const std::string &where) {
    const json p = {{"tau_pos", param(c, "tau_pos")},
                    {"tau_neg", param(c, "tau_neg")},
                    {"loss_agg_mode", "seq-mean-token-mean"}};
    check_verl_loss(c, where, "sapo", p, {});
}

// clip_cov_ratio < 1 with more candidates than k: verl drops k candidates
// drawn with torch.randperm, ours k drawn with its own generator, so the two
// draws differ. Compared: the number dropped (k, as verl rounds it), that each
// token ours drops is one of verl's candidates (the vector's `candidates`, from
// verl at clip_cov_ratio 1), the candidate count, and strictly the loss and
// gradient given our draw: every token ours keeps has verl's gradient with
// nothing dropped, and the value is verl's with nothing dropped less the
// dropped tokens' terms (under token-mean an unclipped token's term is its
// gradient, -A r / T).
void verl_clip_cov_random(const json &c, const std::string &where) {
    const double ratio = param(c, "clip_cov_ratio");
    const json p = {{"eps_clip", param(c, "clip_ratio_low")},
                    {"eps_clip_high", param(c, "clip_ratio_high")},
                    {"clip_cov_ratio", ratio},
                    {"clip_cov_lb", param(c, "clip_cov_lb")},
                    {"clip_cov_ub", param(c, "clip_cov_ub")},
                    {"per_token_outputs", true},
                    {"loss_agg_mode", "token-mean"}};
    if (c["parameters"]["loss_agg_mode"] != "token-mean")
        throw std::runtime_error(where + ": the random-draw check needs token-mean");
    Rows r = verl_rows(c["inputs"], where);
    const T::LossRun run = run_ok(where, "clip_cov", p, r.in);
    if (run.status != RL_OK) return;
    const json &out = c["outputs"];
    const auto cand = flat(require(out, "candidates", where), "candidates");
    const auto verl_drop = flat(require(out, "dropped", where), "dropped");
    const auto ours_drop = run.tensors.at("cov_mask");
    const auto g_none = flat(require(out, "grad_log_prob_none_dropped", where), "grad none");
    double n_cand = 0, n_verl = 0, n_ours = 0, loss = out["loss_none_dropped"].get<double>();
    for (size_t t = 0; t < cand.size(); ++t) {
        n_cand += cand[t];
        n_verl += verl_drop[t];
        EXPECT_TRUE(verl_drop[t] == 0 || cand[t] != 0)
            << where << ": vector: verl dropped token " << t << ", not a candidate";
        if (ours_drop[t] == 0) continue;
        n_ours += 1;
        EXPECT_NE(cand[t], 0) << where << ": ours dropped token " << t
                              << ", which is not one of verl's candidates";
        loss -= g_none[t];
    }
    EXPECT_LT(n_verl, n_cand) << where << ": vector: fewer candidates than k, no draw";
    EXPECT_EQ(n_ours, n_verl) << where << ": tokens dropped (k)";
    expect_close(where, "metric cov_candidates", run.metric("cov_candidates"), n_cand);
    expect_close(where, "metric cov_clipfrac", run.metric("cov_clipfrac"),
                 out["metrics"]["pg_clipfrac"].get<double>());
    expect_close(where, "loss (our draw)", run.loss, loss);
    std::vector<double> want = g_none;
    for (size_t t = 0; t < want.size(); ++t)
        if (ours_drop[t] != 0) want[t] = 0.0;
    expect_close(where, "d loss / d log_prob (our draw)", run.grads.at("logprobs"), want);
    // the draw itself is not verl's: the tokens compared are the rest
    deliberate(where, "verl's torch.randperm draw is not reproduced (docs/losses.md, `clip_cov`): "
                      "k and the candidates compared, loss and gradient given our draw");
}

void verl_clip_cov(const json &c, const std::string &where) {
    // clip_cov_ratio 1: every candidate is dropped, which verl's random draw
    // and ours agree on whatever the draw
    if (param(c, "clip_cov_ratio") != 1.0) return verl_clip_cov_random(c, where);
    const json p = {{"eps_clip", param(c, "clip_ratio_low")},
                    {"eps_clip_high", param(c, "clip_ratio_high")},
                    {"clip_cov_ratio", 1.0},
                    {"clip_cov_lb", param(c, "clip_cov_lb")},
                    {"clip_cov_ub", param(c, "clip_cov_ub")},
                    {"loss_agg_mode", c["parameters"]["loss_agg_mode"]}};
    // verl reports the covariance drop fraction as pg_clipfrac
    check_verl_loss(c, where, "clip_cov", p, {{"cov_clipfrac", peer_metric("pg_clipfrac")}});
}

void verl_kl_cov(const json &c, const std::string &where) {
    const json p = {{"kl_cov_ratio", param(c, "kl_cov_ratio")},
                    {"ppo_kl_coef", param(c, "ppo_kl_coef")},
                    {"loss_agg_mode", c["parameters"]["loss_agg_mode"]}};
    check_verl_loss(c, where, "kl_cov", p, {{"abs_kl", peer_metric("ppo_kl")}});
}

void verl_cispo(const json &c, const std::string &where) {
    const json p = {{"clip_low", 1.0 - param(c, "clip_ratio_low")},
                    {"clip_high", 1.0 + param(c, "clip_ratio_high")},
                    {"loss_agg_mode", c["parameters"]["loss_agg_mode"]}};
    check_verl_loss(c, where, "cispo", p, {{"clip_fraction", peer_metric("pg_clipfrac")}});
}

void verl_gpg_loss(const json &c, const std::string &where) {
    const json p = {
        {"clip_low", 1.0}, {"clip_high", 1.0}, {"loss_agg_mode", c["parameters"]["loss_agg_mode"]}};
    check_verl_loss(c, where, "cispo", p, {});
}

void verl_kl_penalty(const json &c, const std::string &where) {
    static const std::map<std::string, std::string> kinds = {{"kl", "k1"},
                                                             {"k1", "k1"},
                                                             {"abs", "abs"},
                                                             {"mse", "k2"},
                                                             {"k2", "k2"},
                                                             {"k3", "k3"},
                                                             {"low_var_kl", "low_var_kl"},
                                                             {"k1+", "k1+"},
                                                             {"k3+", "k3+"},
                                                             {"low_var_kl+", "low_var_kl+"}};
    const std::string kind = c["parameters"].at("kl_penalty");
    const auto it = kinds.find(kind);
    if (it == kinds.end())
        throw std::runtime_error(where + ": no kl_type here maps verl's kl_penalty '" + kind + "'");
    // the KL term alone: old_logprobs = logprobs and advantages 0 make the
    // policy term 0 with gradient 0
    const json p = {{"kl_coef", 1.0}, {"kl_type", it->second}, {"per_token_outputs", true}};
    const T::LossRun run = check_verl_loss(
        c, where, "importance_sampling", p,
        {{"ref_kl", [&c](const json &) { return c["outputs"]["loss"].get<double>(); }}});
    if (run.status != RL_OK) return;
    const Rows r = verl_rows(c["inputs"], where);
    expect_close(where, "per-token kl", run.tensors.at("kl"), flat(c["outputs"]["kl"], "kl"),
                 r.mask);
}

// verl's critic: compute_value_loss = 0.5 * agg(max of the two squared errors)
void verl_value_loss(const json &c, const std::string &where) {
    const json &in = c["inputs"];
    int64_t B = 0, L = 0;
    const auto v = flat(require(in, "vpreds", where), "vpreds", &B, &L);
    std::vector<int64_t> cu = {0};
    for (int64_t i = 0; i < B; ++i) cu.push_back(cu.back() + L);
    T::LossInputs li;
    li.f64("values", v)
        .f64("returns", flat(require(in, "returns", where), "returns"))
        .f64("old_values", flat(require(in, "values", where), "values"))
        .f64("loss_mask", flat(require(in, "response_mask", where), "response_mask"))
        .cu_seqlens(cu);
    const json p = {{"vf_clip", param(c, "cliprange_value")},
                    {"loss_agg_mode", c["parameters"].at("loss_agg_mode")}};
    const T::LossRun run = run_loss("value_loss", p, li);
    ASSERT_EQ(run.status, RL_OK) << where << ": " << run.error;
    const json &out = c["outputs"];
    expect_close(where, "loss", run.loss, out["loss"].get<double>());
    expect_close(where, "d loss / d vpreds", run.grads.at("values"),
                 flat(out["grad_vpreds"], "grad_vpreds"));
    expect_close(where, "metric vf_clipfrac", run.metric("vf_clipfrac"),
                 out["metrics"]["vf_clipfrac"].get<double>());
}

// ---- verl's advantage estimators ---------------------------------------------------------

struct Estimator {
    std::string plugin;
    json params;
    bool group_relative = true;   // a group of one gets 0 here (docs/advantages.md)
    bool token_rewards = false;   // rewards before the last response token go to token_rewards
    bool compare_returns = false; // the estimator emits returns (gae, reinforce_pp, remax)
};

void check_verl_advantage(const json &c, const std::string &where, const Estimator &e) {
    const json &in = c["inputs"];
    int64_t B = 0, L = 0;
    const auto tlr = flat(require(in, "token_level_rewards", where), "token_level_rewards", &B, &L);
    const auto mask = flat(require(in, "response_mask", where), "response_mask");
    std::vector<int64_t> cu = {0}, groups;
    std::vector<double> rewards(size_t(B), 0.0), token_rewards(tlr.size(), 0.0);
    std::map<int64_t, int> group_size;
    for (int64_t i = 0; i < B; ++i) {
        cu.push_back(cu.back() + L);
        groups.push_back(in.contains("index") ? in["index"][size_t(i)].get<int64_t>() : i);
        ++group_size[groups.back()];
        int64_t last = -1;
        for (int64_t t = 0; t < L; ++t)
            if (mask[size_t(i * L + t)] != 0) last = t;
        if (last < 0) throw std::runtime_error(where + ": row " + std::to_string(i) + " is empty");
        for (int64_t t = 0; t < L; ++t) {
            const double x = tlr[size_t(i * L + t)];
            if (!e.token_rewards || t == last)
                rewards[size_t(i)] += x; // verl's outcome estimators sum the row
            else
                token_rewards[size_t(i * L + t)] = x;
        }
    }
    std::map<std::string, std::vector<double>> tensors = {{"loss_mask", mask}};
    if (e.token_rewards) tensors["token_rewards"] = token_rewards;
    if (in.contains("values")) tensors["values"] = flat(in["values"], "values");
    if (in.contains("reward_baselines")) {
        const auto base = vec(in["reward_baselines"], "reward_baselines");
        std::vector<double> per_token(tlr.size(), 0.0);
        for (int64_t i = 0; i < B; ++i)
            for (int64_t t = 0; t < L; ++t)
                if (mask[size_t(i * L + t)] != 0) per_token[size_t(i * L + t)] = base[size_t(i)];
        tensors["reward_baselines"] = per_token;
    }
    rltest::Instance inst(rltest::load("advantage-" + e.plugin), e.params.dump());
    const rltest::Outputs o = inst.advantage(rewards, groups, cu, tensors);
    ASSERT_TRUE(o.ok()) << where << ": " << e.plugin << " " << e.params.dump() << ": " << o.error;
    const auto &adv = o.tensors.at("advantages");
    std::vector<double> keep = mask;
    if (e.group_relative) {
        for (int64_t i = 0; i < B; ++i) {
            if (group_size[groups[size_t(i)]] != 1) continue;
            deliberate(where, "row " + std::to_string(i) +
                                  " is a group of one: verl gives it a baseline of 0, ours "
                                  "advantage 0 (docs/advantages.md, \"Groups of one have no "
                                  "relative signal\"); the other rows compared");
            for (int64_t t = 0; t < L; ++t) {
                keep[size_t(i * L + t)] = 0;
                EXPECT_EQ(adv[size_t(i * L + t)], 0.0) << where << ": singleton row " << i;
            }
        }
    }
    const json &out = c["outputs"];
    expect_close(where, "advantages", adv, flat(out["advantages"], "advantages"), keep);
    if (e.compare_returns)
        expect_close(where, "returns", o.tensors.at("returns"), flat(out["returns"], "returns"),
                     keep);
}

json grpo_params(const json &c) {
    return {{"norm_by_std", c["parameters"].at("norm_adv_by_std_in_grpo").get<bool>()},
            {"eps", param(c, "epsilon")}};
}

// ---- AReaL -------------------------------------------------------------------------------

T::LossInputs areal_inputs(const json &in, const std::string &where, std::vector<double> *mask,
                           bool prox) {
    T::LossInputs li;
    std::vector<int64_t> cu;
    for (const auto &x : require(in, "cu_seqlens", where)) cu.push_back(x.get<int64_t>());
    *mask = vec(require(in, "loss_mask", where), "loss_mask");
    li.f64("logprobs", vec(require(in, "logprobs", where), "logprobs"))
        .f64("advantages", vec(require(in, "advantages", where), "advantages"))
        .f64("old_logprobs", vec(require(in, "old_logprobs", where), "old_logprobs"))
        .f64("loss_mask", *mask)
        .cu_seqlens(cu);
    if (prox)
        li.f64("prox_logprobs", vec(require(in, "proximal_logprobs", where), "proximal_logprobs"));
    return li;
}

// Our decoupled_ppo with `p` on an AReaL vector's inputs (with the behaviour
// logprobs); their loss mask in *mask.
T::LossRun areal_decoupled_ppo(const json &c, const std::string &where, const json &p,
                               std::vector<double> *mask) {
    return run_ok(where, "decoupled_ppo", p, areal_inputs(c["inputs"], where, mask, true));
}

void areal_ppo_actor(const json &c, const std::string &where) {
    const json &pp = c["parameters"];
    json p = {{"eps_clip", pp.at("eps_clip")},
              {"importance_sampling_level", pp.at("importance_sampling_level")},
              {"per_token_outputs", true}};
    if (!pp.at("eps_clip_higher").is_null()) p["eps_clip_higher"] = pp["eps_clip_higher"];
    if (!pp.at("c_clip").is_null()) p["c_clip"] = pp["c_clip"];
    const json &rs = pp.at("rejection_sampling");
    bool mask_action = false;
    if (!rs.is_null()) {
        json o;
        for (const char *k : {"level", "action", "metric", "upper", "lower"})
            if (!rs.at(k).is_null()) o[k] = rs[k];
        // AReaL keeps a default agg at token level and ignores it; ours refuses it there
        if (rs.at("level") == "sequence") o["agg"] = rs.at("agg");
        p["rejection_sampling"] = o;
        mask_action = rs.at("action") == "mask";
    } else {
        // AReaL without rejection sampling applies no behaviour weight
        // (docs/losses.md, `decoupled_ppo`: "`disabled` ... as AReaL without
        // rejection sampling")
        p["behav_imp_weight_mode"] = "disabled";
    }
    std::vector<double> mask;
    const T::LossRun run = areal_decoupled_ppo(c, where, p, &mask);
    if (run.status != RL_OK) return;
    const json &out = c["outputs"];
    const json &m = out["metrics"];
    expect_close(where, "loss", run.loss, out["loss"].get<double>());
    expect_close(where, "d loss / d logprobs", run.grads.at("logprobs"),
                 vec(out["grad_logprobs"], "grad_logprobs"));
    expect_close(where, "metric approx_kl", run.metric("approx_kl"), m["approx_kl"].get<double>());
    if (m.contains("behave_imp_weight")) {
        expect_close(where, "metric behav_imp_weight", run.metric("behav_imp_weight"),
                     m["behave_imp_weight"].get<double>());
        expect_close(where, "metric behav_approx_kl", run.metric("behav_approx_kl"),
                     m["behave_approx_kl"].get<double>());
        const std::string frac = mask_action ? "behav_maskfrac" : "behav_truncfrac";
        expect_close(where, "metric " + frac, run.metric(frac),
                     m["rs_filtered_fraction"].get<double>());
    }
    // AReaL's actor logs clip_ratio, dual_clip_ratio and importance_weight as
    // sums over the kept tokens divided by every loss token. Ours: at token
    // level over every loss token, rejected ones included; at sequence level
    // over the kept tokens (docs/losses.md, `decoupled_ppo`, "Difference from
    // AReaL"). The per-token values are compared under AReaL's reduction, and
    // the scalar metrics where the two reductions coincide (nothing rejected).
    const auto &rej = mask_action ? run.tensors.at("rejection_mask") : std::vector<double>{};
    double n = 0, clip = 0, dual = 0, ratio = 0, rejected = 0;
    for (size_t t = 0; t < mask.size(); ++t) {
        if (mask[t] == 0) continue;
        ++n;
        const double keep = rej.empty() ? 1.0 : 1.0 - rej[t];
        rejected += 1.0 - keep;
        clip += keep * run.tensors.at("clip_mask")[t];
        if (run.tensors.count("dual_clip_mask")) dual += keep * run.tensors.at("dual_clip_mask")[t];
        ratio += keep * run.tensors.at("ratio")[t];
    }
    n = std::max(n, 1.0);
    expect_close(where, "sum of kept clip_mask / loss tokens", clip / n,
                 m["clip_ratio"].get<double>());
    expect_close(where, "sum of kept dual_clip_mask / loss tokens", dual / n,
                 m["dual_clip_ratio"].get<double>());
    expect_close(where, "sum of kept ratio / loss tokens", ratio / n,
                 m["importance_weight"].get<double>());
    if (rejected == 0) {
        expect_close(where, "metric pg_clipfrac", run.metric("pg_clipfrac"),
                     m["clip_ratio"].get<double>());
        if (!p.contains("c_clip"))
            EXPECT_EQ(m["dual_clip_ratio"].get<double>(), 0.0) << where;
        else
            expect_close(where, "metric dual_clipfrac", run.metric("dual_clipfrac"),
                         m["dual_clip_ratio"].get<double>());
        expect_close(where, "metric ratio_mean", run.metric("ratio_mean"),
                     m["importance_weight"].get<double>());
    } else if (pp.at("importance_sampling_level") == "sequence") {
        // at sequence level our pg_clipfrac / dual_clipfrac are AReaL's: the
        // kept tokens' clips over every loss token; ratio_mean is the mean over
        // the kept tokens (docs/losses.md, `decoupled_ppo`)
        expect_close(where, "metric pg_clipfrac", run.metric("pg_clipfrac"),
                     m["clip_ratio"].get<double>());
        if (p.contains("c_clip"))
            expect_close(where, "metric dual_clipfrac", run.metric("dual_clipfrac"),
                         m["dual_clip_ratio"].get<double>());
        deliberate(where, "tokens rejected: ratio_mean compared per token under AReaL's "
                          "reduction (docs/losses.md, `decoupled_ppo`)");
    } else {
        deliberate(where, "tokens rejected: clip and ratio metrics compared per token under "
                          "AReaL's reduction (docs/losses.md, `decoupled_ppo`)");
    }
}

// AReaL before bc9f009: behave_imp_weight_cap / behave_imp_weight_mode, which
// docs/losses.md maps onto decoupled_ppo's parameters of the same names.
void areal_legacy_ppo_actor(const json &c, const std::string &where) {
    const json &pp = c["parameters"];
    json p = {{"eps_clip", pp.at("eps_clip")},
              {"eps_clip_higher", pp.at("eps_clip_higher")},
              {"importance_sampling_level", pp.at("importance_sampling_level")},
              {"behave_imp_weight_mode", pp.at("behave_imp_weight_mode")}};
    if (!pp.at("c_clip").is_null()) p["c_clip"] = pp["c_clip"];
    if (!pp.at("behave_imp_weight_cap").is_null())
        p["behave_imp_weight_cap"] = pp["behave_imp_weight_cap"];
    std::vector<double> mask;
    const T::LossRun run = areal_decoupled_ppo(c, where, p, &mask);
    if (run.status != RL_OK) return;
    const json &out = c["outputs"];
    const json &m = out["metrics"];
    const auto peer_grad = vec(out["grad_logprobs"], "grad_logprobs");
    expect_close(where, "metric approx_kl", run.metric("approx_kl"), m["approx_kl"].get<double>());
    if (pp["behave_imp_weight_mode"] == "token_mask" &&
        pp["importance_sampling_level"] == "sequence") {
        // The older AReaL keeps a capped token in its sequence's ratio and mean
        // advantage (weight 0); ours, as AReaL since bc9f009, first drops it
        // from the sequence (docs/losses.md, `decoupled_ppo`, "the older
        // modes"). Compared: the gradient on the sequences with no capped token.
        const auto lp = vec(c["inputs"]["logprobs"], "logprobs");
        const auto prox = vec(c["inputs"]["proximal_logprobs"], "proximal_logprobs");
        const auto old = vec(c["inputs"]["old_logprobs"], "old_logprobs");
        std::vector<double> keep(lp.size(), 0.0);
        const double cap = pp["behave_imp_weight_cap"].get<double>();
        const auto &cu = c["inputs"]["cu_seqlens"];
        int64_t compared = 0;
        for (size_t s = 0; s + 1 < cu.size(); ++s) {
            const auto b = cu[s].get<size_t>(), e = cu[s + 1].get<size_t>();
            bool capped = false;
            for (size_t t = b; t < e; ++t)
                capped |= mask[t] != 0 && std::exp(prox[t] - old[t]) > cap;
            if (capped) continue;
            for (size_t t = b; t < e; ++t) keep[t] = mask[t], compared += mask[t] != 0;
        }
        ASSERT_GT(compared, 0) << where << ": no sequence without a capped token to compare";
        deliberate(where, "token_mask at sequence level: the older AReaL keeps capped tokens in "
                          "the sequence ratio, ours drops them (docs/losses.md, `decoupled_ppo`); "
                          "the gradient compared on the " +
                              std::to_string(compared) +
                              " tokens of sequences without a capped token");
        expect_close(where, "d loss / d logprobs", run.grads.at("logprobs"), peer_grad, keep);
        return;
    }
    expect_close(where, "loss", run.loss, out["loss"].get<double>());
    expect_close(where, "d loss / d logprobs", run.grads.at("logprobs"), peer_grad);
    expect_close(where, "metric pg_clipfrac", run.metric("pg_clipfrac"),
                 m["clip_ratio"].get<double>());
    expect_close(where, "metric ratio_mean", run.metric("ratio_mean"),
                 m["importance_weight"].get<double>());
    if (p.contains("c_clip"))
        expect_close(where, "metric dual_clipfrac", run.metric("dual_clipfrac"),
                     m["dual_clip_ratio"].get<double>());
    if (m.contains("behave_imp_weight")) {
        expect_close(where, "metric behav_imp_weight", run.metric("behav_imp_weight"),
                     m["behave_imp_weight"].get<double>());
        expect_close(where, "metric behav_approx_kl", run.metric("behav_approx_kl"),
                     m["behave_approx_kl"].get<double>());
    }
}

// sapo_loss_fn at token and sequence level: `sapo` with the same
// importance_sampling_level; AReaL's logged importance_weight and soft gate are
// token means over the loss tokens (at sequence level of s_i and the sequence's gate).
void areal_sapo(const json &c, const std::string &where) {
    const json p = {{"tau_pos", param(c, "tau_pos")},
                    {"tau_neg", param(c, "tau_neg")},
                    {"importance_sampling_level", c["parameters"].at("importance_sampling_level")},
                    {"loss_agg_mode", "token-mean"}};
    std::vector<double> mask;
    const T::LossInputs in = areal_inputs(c["inputs"], where, &mask, false);
    const T::LossRun run = run_loss("sapo", p, in);
    ASSERT_EQ(run.status, RL_OK) << where << ": " << run.error;
    const json &out = c["outputs"];
    expect_close(where, "loss", run.loss, out["loss"].get<double>());
    expect_close(where, "d loss / d logprobs", run.grads.at("logprobs"),
                 vec(out["grad_logprobs"], "grad_logprobs"));
    expect_close(where, "metric ratio_mean", run.metric("ratio_mean"),
                 out["metrics"]["importance_weight"].get<double>());
    expect_close(where, "metric gate_mean", run.metric("gate_mean"),
                 out["metrics"]["sapo_soft_gate"].get<double>());
}

// AReaL's critic: ppo_critic_loss_fn (mse = 0.5 e^2, huber with delta 10), a
// token mean over the loss tokens.
void areal_critic(const json &c, const std::string &where) {
    const json &in = c["inputs"];
    const std::string kind = c["parameters"].at("loss_fn_type");
    json p = {{"vf_clip", param(c, "value_eps_clip")}, {"loss_agg_mode", "token-mean"}};
    if (kind == "huber")
        p["huber_delta"] = 10.0; // AReaL's fixed delta
    else if (kind != "mse")
        throw std::runtime_error(where + ": no value_loss form for loss_fn_type '" + kind + "'");
    std::vector<int64_t> cu;
    for (const auto &x : require(in, "cu_seqlens", where)) cu.push_back(x.get<int64_t>());
    T::LossInputs li;
    li.f64("values", vec(require(in, "value", where), "value"))
        .f64("old_values", vec(require(in, "old_value", where), "old_value"))
        .f64("returns", vec(require(in, "target_value", where), "target_value"))
        .f64("loss_mask", vec(require(in, "loss_mask", where), "loss_mask"))
        .cu_seqlens(cu);
    const T::LossRun run = run_loss("value_loss", p, li);
    ASSERT_EQ(run.status, RL_OK) << where << ": " << run.error;
    const json &out = c["outputs"];
    // AReaL computes in float32 (the inputs are its float32 values): within 1e-5
    expect_close(where, "loss", run.loss, out["loss"].get<double>());
    expect_close(where, "d loss / d value", run.grads.at("values"),
                 vec(out["grad_value"], "grad_value"));
    expect_close(where, "metric vf_clipfrac", run.metric("vf_clipfrac"),
                 out["metrics"]["clip_ratio"].get<double>());
}

// AReaL's Normalization(NormConfig) of per-token values: the `areal`
// advantage's adv_norm, fed the values as token rewards with gamma 0 (so the
// advantages before normalization are the values themselves) and group ids
// from AReaL's consecutive groups of group_size rows.
void areal_normalization(const json &c, const std::string &where) {
    const json &pp = c["parameters"];
    const json &in = c["inputs"];
    int64_t B = 0, L = 0;
    const auto x = flat(require(in, "x", where), "x", &B, &L);
    const auto mask = flat(require(in, "loss_mask", where), "loss_mask");
    const int64_t group_size = pp.at("group_size").get<int64_t>();
    std::vector<int64_t> cu = {0}, groups;
    for (int64_t i = 0; i < B; ++i) {
        cu.push_back(cu.back() + L);
        groups.push_back(i / group_size);
    }
    const auto level = [](const json &l) { return l.is_null() ? json("none") : l; };
    const json params = {{"gamma", 0.0},
                         {"adv_norm",
                          {{"mean_level", level(pp.at("mean_level"))},
                           {"std_level", level(pp.at("std_level"))},
                           {"mean_leave1out", pp.at("mean_leave1out")},
                           {"std_unbiased", pp.at("std_unbiased")},
                           {"eps", pp.at("eps")}}}};
    rltest::Instance inst(rltest::load("advantage-areal"), params.dump());
    const rltest::Outputs o = inst.advantage(std::vector<double>(size_t(B), 0.0), groups, cu,
                                             {{"loss_mask", mask}, {"token_rewards", x}});
    ASSERT_TRUE(o.ok()) << where << ": " << params.dump() << ": " << o.error;
    const auto peer = flat(c["outputs"]["normalized"], "normalized");
    const int64_t full = B / group_size * group_size;
    const bool by_group = pp.at("mean_level") == "group" || pp.at("std_level") == "group";
    if (!by_group || full == B) {
        expect_close(where, "normalized", o.tensors.at("advantages"), peer, mask);
        return;
    }
    // B not a multiple of group_size: AReaL's group loops cover bs // group_size
    // groups, the last B % group_size rows are in none: group mean 0 and group
    // std 0, so (x - 0) / (0 + eps) (docs/advantages.md, "AReaL's leftover
    // rows"). Ours has no group_size: those rows are a group of their own.
    if (pp.at("mean_level") == "batch")
        throw std::runtime_error(where + ": leftover rows with a batch mean: no mapping here");
    deliberate(where, "rows " + std::to_string(full) + ".." + std::to_string(B - 1) +
                          " are in no AReaL group (B % group_size): compared as AReaL's x / eps "
                          "(group std) or x (no std) there, ours on the full groups");
    std::vector<double> in_groups = mask, left(mask.size(), 0.0), expect(mask.size(), 0.0);
    const bool group_std = pp.at("std_level") == "group";
    const double eps = pp.at("eps").get<double>();
    for (int64_t t = full * L; t < B * L; ++t) {
        in_groups[size_t(t)] = 0.0;
        left[size_t(t)] = mask[size_t(t)];
        expect[size_t(t)] = group_std ? x[size_t(t)] / eps : x[size_t(t)];
    }
    expect_close(where, "normalized (full groups)", o.tensors.at("advantages"), peer, in_groups);
    expect_close(where, "AReaL's leftover rows", expect, peer, left);
}

// AReaL's actor advantage pipeline (PPOActor._compute_advantages) onto the
// `areal` advantage. AReaL's rows are aligned with input_ids and it rolls
// loss_mask and logprobs by -1 (position t is the action that produced token
// t + 1); our sequences are those positions: loss_mask[t] = AReaL's
// loss_mask[t + 1], old_logprobs[t] = logprobs[t + 1], ref_logprobs and
// values as AReaL reads them. A row that fills max_seqlen has no EOS: it is
// `truncated` (bootstraps from its last value; with mask_no_eos_with_zero
// its reward is 0).
void areal_compute_advantages(const json &c, const std::string &where) {
    const json &pp = c["parameters"];
    const json &in = c["inputs"];
    int64_t B = 0, M = 0;
    const auto attn = flat(require(in, "attention_mask", where), "attention_mask", &B, &M);
    const auto lmask = flat(require(in, "loss_mask", where), "loss_mask");
    const auto lp = flat(require(in, "logprobs", where), "logprobs");
    std::vector<double> mask(lmask.size()), old(lp.size()), truncated(lp.size());
    std::vector<int64_t> cu = {0}, groups;
    // AReaL groups group_size consecutive rows; ours are the batch's group ids,
    // one set for adv_norm and reward_norm: a vector with both must agree.
    const json reward_norm = pp.value("reward_norm", json());
    int64_t group_size = 1;
    for (const json *n : {&pp.at("adv_norm"), &reward_norm}) {
        if (n->is_null()) continue;
        const int64_t g = n->at("group_size").get<int64_t>();
        if (group_size != 1 && g != 1 && g != group_size)
            throw std::runtime_error(where + ": adv_norm and reward_norm with different "
                                             "group_size have no equivalent here");
        if (g != 1) group_size = g;
    }
    for (int64_t i = 0; i < B; ++i) {
        cu.push_back(cu.back() + M);
        groups.push_back(i / group_size);
        double seqlen = 0;
        for (int64_t t = 0; t < M; ++t) seqlen += attn[size_t(i * M + t)];
        for (int64_t t = 0; t < M; ++t) {
            const size_t k = size_t(i * M + t), next = size_t(i * M + (t + 1) % M);
            mask[k] = lmask[next];
            old[k] = lp[next] * mask[k];
            truncated[k] = seqlen == double(M) ? 1.0 : 0.0;
        }
    }
    std::map<std::string, std::vector<double>> tensors = {
        {"loss_mask", mask}, {"old_logprobs", old}, {"truncated", truncated}};
    if (pp.at("kl_ctl").get<double>() > 0) {
        std::vector<double> ref = flat(require(in, "ref_logp", where), "ref_logp");
        for (size_t k = 0; k < ref.size(); ++k) ref[k] *= mask[k];
        tensors["ref_logprobs"] = ref;
    } else {
        tensors.erase("old_logprobs");
    }
    if (in.contains("values")) tensors["values"] = flat(in["values"], "values");
    json params = {{"reward_bias", pp.at("reward_bias")},
                   {"reward_scaling", pp.at("reward_scaling")},
                   {"reward_clip", pp.at("reward_clip")},
                   {"mask_no_eos_with_zero", pp.at("mask_no_eos_with_zero")},
                   {"gamma", pp.at("discount")},
                   {"lambda", pp.at("gae_lambda")},
                   {"kl_coef", pp.at("kl_ctl")},
                   {"kl_estimator", pp.at("kl_estimator")}};
    for (const char *key : {"adv_norm", "reward_norm"}) {
        const json n = pp.value(key, json());
        if (n.is_null()) continue;
        const auto level = [](const json &l) { return l.is_null() ? json("none") : l; };
        params[key] = {{"mean_level", level(n.at("mean_level"))},
                       {"std_level", level(n.at("std_level"))},
                       {"mean_leave1out", n.at("mean_leave1out")},
                       {"std_unbiased", n.at("std_unbiased")},
                       {"eps", n.at("eps")}};
    }
    rltest::Instance inst(rltest::load("advantage-areal"), params.dump());
    const rltest::Outputs o =
        inst.advantage(vec(require(in, "rewards", where), "rewards"), groups, cu, tensors);
    ASSERT_TRUE(o.ok()) << where << ": " << params.dump() << ": " << o.error;
    const json &out = c["outputs"];
    expect_close(where, "loss_mask (rolled)", mask, flat(out["loss_mask"], "loss_mask"));
    // B not a multiple of a group-level normalization's group_size: the last
    // B % group_size rows are in no AReaL group (reward / advantage divided by
    // eps there, docs/advantages.md, "AReaL's leftover rows"); compared on the
    // full groups, whose values no leftover row touches at group level.
    std::vector<double> keep = mask;
    const int64_t full = B / group_size * group_size;
    if (full != B) {
        for (const json *n : {&pp.at("adv_norm"), &reward_norm}) {
            if (n->is_null()) continue;
            if (n->at("mean_level") == "batch" || n->at("std_level") == "batch")
                throw std::runtime_error(where + ": leftover rows with a batch level: no "
                                                 "mapping here");
        }
        deliberate(where, "rows " + std::to_string(full) + ".." + std::to_string(B - 1) +
                              " are in no AReaL group (B % group_size): compared on the full "
                              "groups only");
        for (int64_t k = full * M; k < B * M; ++k) keep[size_t(k)] = 0.0;
    }
    expect_close(where, "advantages", o.tensors.at("advantages"),
                 flat(out["advantages"], "advantages"), keep);
    expect_close(where, "returns", o.tensors.at("returns"), flat(out["returns"], "returns"), keep);
}

// ---- prime-rl -----------------------------------------------------------------------------

// compute_loss: the rl component (default_loss_fn = dppo, ipo_loss_fn = ipo)
// plus the ce and ref_kl components, each over its own normalizer.
void prime_rl_compute_loss(const json &c, const std::string &where) {
    const json &pp = c["parameters"];
    const json &in = c["inputs"];
    const std::string type = pp.at("type");
    json p = {{"adv_tau", pp.at("adv_tau")},
              {"kl_tau", pp.at("kl_tau")},
              {"loss_agg_mode", "token-mean"}};
    if (type == "default") {
        p["dppo_mask_low"] = pp.at("dppo_mask_low");
        p["dppo_mask_high"] = pp.at("dppo_mask_high");
    } else if (type == "ipo") {
        p["ipo_threshold"] = pp.at("ipo_threshold");
    } else {
        throw std::runtime_error(where + ": no loss here for prime-rl's loss type '" + type + "'");
    }
    std::vector<int64_t> cu;
    for (const auto &x : require(in, "cu_seqlens", where)) cu.push_back(x.get<int64_t>());
    const auto mask = vec(require(in, "loss_mask", where), "loss_mask");
    T::LossInputs li;
    li.f64("logprobs", vec(require(in, "trainer_logprobs", where), "trainer_logprobs"))
        .f64("old_logprobs", vec(require(in, "inference_logprobs", where), "inference_logprobs"))
        .f64("ref_logprobs", vec(require(in, "ref_logprobs", where), "ref_logprobs"))
        .f64("advantages", vec(require(in, "advantages", where), "advantages"))
        .f64("loss_mask", mask)
        .cu_seqlens(cu);
    // Our normalizers: the rl component over every loss token (a token with
    // rl weight 0 stays in it), ce / ref_kl over their loss tokens of non-zero
    // weight (docs/losses.md, `dppo` and `ipo`, "Differences from prime-rl");
    // the vectors pass prime-rl exactly these counts.
    const auto count = [&](const std::string &name) {
        double k = 0;
        const auto w = vec(in.at(name), name);
        for (size_t t = 0; t < w.size(); ++t) k += mask[t] != 0 && w[t] != 0;
        return k;
    };
    double loss_tokens = 0;
    for (double m : mask) loss_tokens += m != 0;
    EXPECT_EQ(pp.at("rl_scale").get<double>(), loss_tokens) << where << ": rl_scale";
    for (const auto &[name, scale] : {std::pair<std::string, std::string>{"rl_weights", ""},
                                      {"ce_weights", "ce_scale"},
                                      {"ref_kl_weights", "ref_kl_scale"}}) {
        if (!in.contains(name)) continue;
        li.f64(name, vec(in[name], name));
        if (!scale.empty()) {
            EXPECT_EQ(pp.at(scale).get<double>(), count(name)) << where << ": " << scale;
        }
    }
    const T::LossRun run = run_loss(type == "default" ? "dppo" : "ipo", p, li);
    ASSERT_EQ(run.status, RL_OK) << where << ": " << p.dump() << ": " << run.error;
    const json &out = c["outputs"];
    expect_close(where, "loss", run.loss, out["loss"].get<double>());
    expect_close(where, "d loss / d trainer_logprobs", run.grads.at("logprobs"),
                 vec(out["grad_trainer_logprobs"], "grad_trainer_logprobs"));
}

// ---- xorl ---------------------------------------------------------------------------------

// xorl's losses read labels (-100 off the loss) and logits (hidden states under an
// identity LM head); the vectors carry the selected-token logprobs xorl computed
// from them and its gradient with respect to those logprobs. Rows become packed
// sequences; the loss tokens are labels != -100 (xorl's default TokenPartial
// reducer is the token mean over them, our token-mean).
struct XorlRows {
    int64_t B = 0, L = 0;
    std::vector<double> mask;
    std::vector<int64_t> labels;
    std::vector<int64_t> cu = {0};
};

XorlRows xorl_rows(const json &inputs, const std::string &where) {
    XorlRows r;
    const auto labels = flat(require(inputs, "labels", where), "labels", &r.B, &r.L);
    for (double x : labels) {
        r.labels.push_back(static_cast<int64_t>(x));
        r.mask.push_back(x != -100 ? 1.0 : 0.0);
    }
    for (int64_t i = 0; i < r.B; ++i) r.cu.push_back(r.cu.back() + r.L);
    return r;
}

T::LossInputs xorl_policy_inputs(const json &c, const XorlRows &r, const std::string &where,
                                 bool rollout = true) {
    const json &in = c["inputs"];
    T::LossInputs li;
    li.f64("logprobs", flat(require(c["outputs"], "logprobs", where), "logprobs"))
        .f64("old_logprobs", flat(require(in, "old_logprobs", where), "old_logprobs"))
        .f64("advantages", flat(require(in, "advantages", where), "advantages"))
        .f64("loss_mask", r.mask)
        .cu_seqlens(r.cu);
    if (rollout && in.contains("rollout_logprobs"))
        li.f64("rollout_logprobs", flat(in["rollout_logprobs"], "rollout_logprobs"));
    return li;
}

// The metrics xorl and our plugin both report under the same name; each one the
// peer emitted must be ours too and agree.
void expect_xorl_metrics(const std::string &where, const T::LossRun &run, const json &peer) {
    static const char *shared[] = {
        "pg_clipfrac",  "icepop_maskfrac",    "tis_mean",       "tis_min",    "tis_max",
        "tis_clipfrac", "kl_sample_train_k3", "entropy_sample", "ratio_mean", "ratio_min",
        "ratio_max",    "clip_fraction",      "valid_tokens"};
    for (const char *m : shared) {
        if (!peer.contains(m)) continue;
        if (!run.has_metric(m)) {
            ADD_FAILURE() << where << ": our loss emitted no metric '" << m << "'";
            continue;
        }
        expect_close(where, std::string("metric ") + m, run.metric(m), peer[m].get<double>());
    }
}

// Our `loss` with `p` on the vector's inputs against the vector's loss, d loss
// / d logprobs and metrics.
void xorl_compare(const json &c, const std::string &where, const std::string &loss, const json &p,
                  const XorlRows &r) {
    const T::LossRun run = run_ok(where, loss, p, xorl_policy_inputs(c, r, where));
    if (run.status != RL_OK) return;
    const json &out = c["outputs"];
    expect_loss_and_grad(where, run, out);
    expect_xorl_metrics(where, run, out["metrics"]);
}

// policy_loss_function: same parameter names here. Two deliberate differences
// (docs/losses.md, `policy_loss`, "Differences from xorl, on purpose"): xorl
// keeps IcePop-masked tokens in the reported value (IcePop only zeroes their
// gradient), and leaves the TIS weight out of the gradient (its surrogate is
// ratio * A * CE). With them removed: xorl's value is ours without IcePop (TIS
// kept), xorl's gradient ours without TIS (IcePop kept), both strict; and ours
// with TIS is xorl's gradient times the clipped TIS weight, token by token.
void xorl_policy_loss(const json &c, const std::string &where) {
    const XorlRows r = xorl_rows(c["inputs"], where);
    const T::LossInputs in = xorl_policy_inputs(c, r, where);
    json p = c["parameters"];
    p["loss_agg_mode"] = "token-mean";
    const bool icepop = p.contains("icepop_beta") && !p["icepop_beta"].is_null();
    const bool tis = p.value("use_tis", false);
    const json &out = c["outputs"];
    const auto peer_grad = flat(out["grad_logprobs"], "grad_logprobs");
    const T::LossRun full = run_ok(where, "policy_loss", p, in);
    if (full.status != RL_OK) return;
    expect_xorl_metrics(where, full, out["metrics"]);

    json value_p = p;
    if (icepop) {
        deliberate(where, "xorl keeps IcePop-masked tokens in the loss value: value compared with "
                          "ours without icepop_beta (docs/losses.md, policy_loss)");
        value_p.erase("icepop_beta");
    }
    const T::LossRun value_run = icepop ? run_ok(where, "policy_loss", value_p, in) : full;
    expect_close(where, "loss", value_run.loss, out["loss"].get<double>());

    json grad_p = p;
    if (tis) {
        deliberate(where, "xorl leaves the TIS weight out of the gradient: gradient compared with "
                          "ours without use_tis, and ours as xorl's times the TIS weight "
                          "(docs/losses.md, policy_loss)");
        for (const char *k : {"use_tis", "tis_clip_low", "tis_clip_high"}) grad_p.erase(k);
    }
    const T::LossRun grad_run =
        tis ? run_ok(where, "policy_loss", grad_p, xorl_policy_inputs(c, r, where, false)) : full;
    if (grad_run.status != RL_OK) return;
    expect_close(where, "d loss / d logprobs", grad_run.grads.at("logprobs"), peer_grad);
    if (tis) {
        const auto lp = flat(out["logprobs"], "logprobs");
        const auto roll = flat(c["inputs"]["rollout_logprobs"], "rollout_logprobs");
        const double lo = p.value("tis_clip_low", 0.1), hi = p.value("tis_clip_high", 2.0);
        std::vector<double> weighted(peer_grad.size());
        for (size_t t = 0; t < weighted.size(); ++t)
            weighted[t] = std::clamp(std::exp(lp[t] - roll[t]), lo, hi) * peer_grad[t];
        expect_close(where, "d loss / d logprobs (TIS-weighted peer)", full.grads.at("logprobs"),
                     weighted);
    }
}

void xorl_importance_sampling(const json &c, const std::string &where) {
    const XorlRows r = xorl_rows(c["inputs"], where);
    json p = {{"loss_agg_mode", "token-mean"}};
    if (c["parameters"].contains("compute_kl_stats"))
        p["compute_kl_stats"] = c["parameters"]["compute_kl_stats"];
    xorl_compare(c, where, "importance_sampling", p, r);
}

// cispo_loss_function: clip_low_threshold / clip_high_threshold are our
// clip_low / clip_high (absolute ratio bounds); the defaults (0, 4) are left to
// both sides when the vector does not name them.
void xorl_cispo(const json &c, const std::string &where) {
    const XorlRows r = xorl_rows(c["inputs"], where);
    const json &pp = c["parameters"];
    json p = {{"loss_agg_mode", "token-mean"}};
    if (pp.contains("clip_low_threshold")) p["clip_low"] = pp["clip_low_threshold"];
    if (pp.contains("clip_high_threshold")) p["clip_high"] = pp["clip_high_threshold"];
    if (pp.contains("compute_kl_stats")) p["compute_kl_stats"] = pp["compute_kl_stats"];
    xorl_compare(c, where, "cispo", p, r);
}

// drgrpo_loss_function: PPO clip-higher plus beta * xorl's k1 / k2 / k3 against
// ref_logprobs (docs/losses.md, "Coming from ..."): ratio_type token is our
// policy_loss, sequence our gspo (advantages constant within a row, where
// xorl's stop-gradient sequence ratio and our exact derivative agree, see
// `gspo`), clip_low / clip_high our eps_clip / eps_clip_high, beta / kl_type
// our kl_coef / kl_type. The vector's absent parameters are xorl's function
// defaults (clip 0.2 / 0.28, beta 0.1, k3). Its reducer picks loss_agg_mode:
// TokenPartial over the loss tokens is token-mean, TokenPartial with the
// constant rows x max length (Dr. GRPO's) seq-mean-token-sum-norm with that
// max_seq_len, SequencePartial over the rows seq-mean-token-mean. Metrics:
// loss/clip/high_fraction + low_fraction = our pg_clipfrac, loss/kl_ref/mean =
// ref_kl, loss/ratio/mean and loss/kl_policy/mean = the token means of our
// per-token ratio and of minus its log; loss/clip/clipped_ratio/mean and
// loss/current_support_fraction (1: every logprob finite) have no counterpart.
// xorl clamps k3's log-ratio to [-10, 10] and ours does not (docs/losses.md,
// "Nothing is clamped silently"): the vectors stay inside that range.
void xorl_drgrpo(const json &c, const std::string &where) {
    const XorlRows r = xorl_rows(c["inputs"], where);
    const json &pp = c["parameters"];
    const bool sequence = pp.value("ratio_type", std::string("token")) == "sequence";
    const double beta = pp.value("beta", 0.1);
    json p = {{"eps_clip", pp.value("clip_low", 0.2)},
              {"eps_clip_high", pp.value("clip_high", 0.28)},
              {"per_token_outputs", true}};
    if (beta > 0) {
        p["kl_coef"] = beta;
        p["kl_type"] = pp.value("kl_type", std::string("k3"));
    }
    int64_t S = 0, n_tok = 0;
    for (int64_t i = 0; i < r.B; ++i) {
        int64_t n = 0;
        for (int64_t t = i * r.L; t < (i + 1) * r.L; ++t) n += r.mask[size_t(t)] != 0;
        S += n > 0;
        n_tok += n;
    }
    const json &red = require(pp, "loss_reducer", where);
    const std::string type = red.at("type").get<std::string>();
    const int64_t scale = red.at("scale").get<int64_t>();
    if (type == "TokenPartial" && scale == n_tok) {
        p["loss_agg_mode"] = "token-mean";
    } else if (type == "TokenPartial" && S > 0 && scale % S == 0) {
        p["loss_agg_mode"] = "seq-mean-token-sum-norm";
        p["max_seq_len"] = scale / S;
    } else if (type == "SequencePartial" && scale == S) {
        p["loss_agg_mode"] = "seq-mean-token-mean";
    } else {
        throw std::runtime_error(where + ": reducer " + red.dump() + " maps onto no loss_agg_mode");
    }
    T::LossInputs in = xorl_policy_inputs(c, r, where);
    if (beta > 0)
        in.f64("ref_logprobs", flat(require(c["inputs"], "ref_logprobs", where), "ref_logprobs"));
    const std::string loss = sequence ? "gspo" : "policy_loss";
    const T::LossRun run = run_ok(where, loss, p, in);
    if (run.status != RL_OK) return;
    const json &out = c["outputs"];
    expect_loss_and_grad(where, run, out);
    const json &m = out["metrics"];
    expect_close(where, "metric pg_clipfrac", run.metric("pg_clipfrac"),
                 m.at("loss/clip/high_fraction").get<double>() +
                     m.at("loss/clip/low_fraction").get<double>());
    if (beta > 0)
        expect_close(where, "metric ref_kl", run.metric("ref_kl"),
                     m.at("loss/kl_ref/mean").get<double>());
    const auto &ratio = run.tensors.at("ratio");
    double ratio_sum = 0, neg_log_sum = 0;
    for (size_t t = 0; t < ratio.size(); ++t) {
        if (r.mask[t] == 0) continue;
        ratio_sum += ratio[t];
        neg_log_sum -= std::log(ratio[t]);
    }
    expect_close(where, "token mean of our ratio (loss/ratio/mean)", ratio_sum / double(n_tok),
                 m.at("loss/ratio/mean").get<double>());
    expect_close(where, "token mean of minus our log-ratio (loss/kl_policy/mean)",
                 neg_log_sum / double(n_tok), m.at("loss/kl_policy/mean").get<double>());
}

// causallm_loss_function with z_loss_coef = our causallm_loss with z_loss. Our
// loss reads logprobs and logsumexp (the trainer's log-softmax pass); the
// gradient xorl reports is on the logits, so ours is carried there by the
// trainer's chain rule: d/dz_v = g_lp (1[v = label] - p_v) + g_lse p_v.
void xorl_causallm(const json &c, const std::string &where) {
    const XorlRows r = xorl_rows(c["inputs"], where);
    const json &rows = require(c["inputs"], "logits", where);
    std::vector<std::vector<double>> logits;
    for (const auto &row : rows)
        for (const auto &tok : row) logits.push_back(vec(tok, "logits"));
    const size_t n = r.labels.size();
    ASSERT_EQ(logits.size(), n) << where << ": logits and labels differ in length";
    std::vector<double> lp(n), lse(n);
    for (size_t t = 0; t < n; ++t) {
        const double mx = *std::max_element(logits[t].begin(), logits[t].end());
        double s = 0;
        for (double z : logits[t]) s += std::exp(z - mx);
        lse[t] = mx + std::log(s);
        lp[t] = r.labels[t] >= 0 ? logits[t][size_t(r.labels[t])] - lse[t] : 0.0;
    }
    const double coef = param(c, "z_loss_coef");
    json p = {{"loss_agg_mode", "token-mean"}};
    T::LossInputs li;
    li.f64("logprobs", lp).i64("labels", r.labels).cu_seqlens(r.cu);
    if (coef != 0) {
        p["z_loss"] = coef;
        li.f64("logsumexp", lse);
    }
    const T::LossRun run = run_ok(where, "causallm_loss", p, li);
    if (run.status != RL_OK) return;
    const json &out = c["outputs"];
    expect_close(where, "loss", run.loss, out["loss"].get<double>());
    const auto &glp = run.grads.at("logprobs");
    std::vector<double> ours, peer;
    size_t t = 0;
    for (const auto &row : out["grad_logits"])
        for (const auto &tok : row) {
            const auto g = vec(tok, "grad_logits");
            for (size_t v = 0; v < g.size(); ++v) {
                const double pv = std::exp(logits[t][v] - lse[t]);
                double d = glp[t] * ((int64_t(v) == r.labels[t] ? 1.0 : 0.0) - pv);
                if (coef != 0) d += run.grads.at("logsumexp")[t] * pv;
                ours.push_back(d);
                peer.push_back(g[v]);
            }
            ++t;
        }
    expect_close(where, "d loss / d logits", ours, peer);
    if (out["metrics"].contains("z_loss")) {
        ASSERT_TRUE(run.has_metric("z_loss")) << where << ": our loss emitted no metric 'z_loss'";
        expect_close(where, "metric z_loss", run.metric("z_loss"),
                     out["metrics"]["z_loss"].get<double>());
    }
}

// ---- Surogate -----------------------------------------------------------------------------

// compute_grpo_per_token_grads (surogate/grpo/loss.py, Surogate's Python
// reference of the seeds its CE backward receives): IPO on `ipo` under the
// mapping of docs/losses.md ("Surogate's IPO per-token gradients"). Surogate's
// seeds are -d loss / d logprobs before its division by the step's loss tokens
// N, so ours run with loss_agg_mode sum and weights 1 / N, and replay / OPD
// tokens become rl_weights 0 and ce_weights (with the 1 / N in them). Its value and metrics are
// means over samples of per-sample values; ours are token means over the step (docs/losses.md,
// "What differs"): they are compared by running ours on each sample alone (weights 1 / n_i) and
// averaging as Surogate does.
struct SurogateCase {
    json params;
    T::LossInputs in;
    std::vector<double> mask;
    std::vector<int64_t> cu;
    size_t n = 0;
    bool replay = false;
};

SurogateCase surogate_case(const json &c, const std::string &where, int64_t lo, int64_t hi) {
    const json &pp = c["parameters"];
    const json &in = c["inputs"];
    SurogateCase s;
    s.params = {{"ipo_mask_low", pp.at("ipo_mask_low")}, {"ipo_mask_high", pp.at("ipo_mask_high")},
                {"adv_tau", pp.at("adv_tau")},           {"kl_tau", pp.at("kl_tau")},
                {"ratio_clip", pp.at("ratio_clip")},     {"loss_agg_mode", "sum"}};
    const auto slice = [&](const std::string &name) {
        const auto v = vec(require(in, name, where), name);
        return std::vector<double>(v.begin() + lo, v.begin() + hi);
    };
    s.mask = slice("loss_mask");
    s.n = s.mask.size();
    double tokens = 0;
    for (double m : s.mask) tokens += m != 0;
    s.in.f64("logprobs", slice("trainer_logprobs"))
        .f64("old_logprobs", slice("inference_logprobs"))
        .f64("advantages", slice("advantages"))
        .f64("loss_mask", s.mask)
        .f64("weights", std::vector<double>(s.n, 1.0 / std::max(tokens, 1.0)));
    if (in.contains("teacher_logprobs")) {
        s.params["teacher_tau"] = pp.at("teacher_tau");
        s.in.f64("teacher_logprobs", slice("teacher_logprobs"));
    }
    std::vector<double> ce(s.n, 0.0), rl(s.n, 1.0);
    bool has_ce = false;
    if (in.contains("replay_mask")) {
        s.replay = true;
        has_ce = true;
        const auto rm = slice("replay_mask"), rw = slice("replay_weights");
        for (size_t t = 0; t < s.n; ++t)
            if (rm[t] != 0 && s.mask[t] != 0) {
                rl[t] = 0.0;
                ce[t] = pp.at("replay_tau").get<double>() * rw[t];
            }
        s.in.f64("rl_weights", rl);
    }
    if (in.contains("hindsight_mask")) {
        has_ce = true;
        const auto hm = slice("hindsight_mask"), h = slice("hindsight_logprobs"),
                   ref = slice("opd_reference_logprobs");
        const double tau = pp.at("opd_tau"), beta = pp.at("opd_beta");
        for (size_t t = 0; t < s.n; ++t)
            if (hm[t] != 0 && s.mask[t] != 0 && rl[t] != 0)
                ce[t] += tau / (1.0 + std::exp(-beta * (h[t] - ref[t])));
    }
    // the ce component's normalizer lives in its weights under `sum` (the
    // input `weights` scales the rl component only)
    for (auto &x : ce) x /= std::max(tokens, 1.0);
    if (has_ce) s.in.f64("ce_weights", ce);
    s.in.cu_seqlens({0, int64_t(s.n)});
    return s;
}

void surogate_grpo(const json &c, const std::string &where) {
    const json &in = c["inputs"];
    const json &out = c["outputs"];
    std::vector<int64_t> cu;
    for (const auto &x : require(in, "cu_seqlens", where)) cu.push_back(x.get<int64_t>());
    const int64_t N = cu.back();
    // The whole step, one packed batch: the gradient.
    SurogateCase step = surogate_case(c, where, 0, N);
    step.in.cu_seqlens(cu);
    double tokens = 0;
    for (double m : step.mask) tokens += m != 0;
    EXPECT_EQ(out.at("loss_scale").get<double>(), tokens) << where << ": loss_scale";
    const T::LossRun run = run_ok(where, "ipo", step.params, step.in);
    if (run.status != RL_OK) return;
    std::vector<double> peer = vec(out.at("per_token_grads"), "per_token_grads");
    for (auto &g : peer) g = -g / tokens;
    expect_close(where, "d loss / d trainer_logprobs (-seed / loss_scale)",
                 run.grads.at("logprobs"), peer);

    // Sample by sample: the value and the metrics, averaged over samples.
    deliberate(where, "Surogate's value and metrics are means over samples of per-sample values "
                      "(ratio_clipped over kept tokens); ours over the step's tokens "
                      "(docs/losses.md, \"Surogate's IPO per-token gradients\", \"What "
                      "differs\"): ours run per sample and averaged as Surogate does");
    const json &pm = out["metrics"];
    double value = 0, samples = 0;
    std::map<std::string, double> sums;
    for (size_t i = 0; i + 1 < cu.size(); ++i) {
        SurogateCase s = surogate_case(c, where, cu[i], cu[i + 1]);
        double n = 0;
        for (double m : s.mask) n += m != 0;
        if (n == 0) continue;
        const T::LossRun r = run_ok(where, "ipo", s.params, s.in);
        if (r.status != RL_OK) return;
        value += r.loss;
        samples += 1;
        const double masked = r.metric("is_masked");
        const double keep = n * (1.0 - masked);
        sums["is_masked"] += masked;
        sums["masked_mismatch_kl"] += r.metric("masked_mismatch_kl");
        sums["unmasked_mismatch_kl"] += r.metric("unmasked_mismatch_kl");
        sums["ratio_clipped"] += keep > 0.5 ? r.metric("ratio_clipped") * n / keep : 0.0;
        if (r.has_metric("teacher_kl")) sums["teacher_kl"] += r.metric("teacher_kl");
    }
    expect_close(where, "policy_loss (mean over samples)", value / samples,
                 pm.at("policy_loss").get<double>());
    if (step.replay) {
        // Surogate's behaviour metrics run over its policy tokens (replay tokens
        // excluded), ours over every loss token: only value and gradient here.
        deliberate(where, "replay tokens: Surogate's masking metrics leave them out, ours count "
                          "them; metrics not compared");
        return;
    }
    for (const auto &[name, sum] : sums)
        expect_close(where, "metric " + name + " (mean over samples)", sum / samples,
                     pm.at(name).get<double>());
}

// ---- the peer functions this test knows --------------------------------------------------

using CaseCheck = std::function<void(const json &, const std::string &)>;

CaseCheck advantage(Estimator e) {
    return [e](const json &c, const std::string &where) { check_verl_advantage(c, where, e); };
}

template <class F>
CaseCheck advantage_with(F make) {
    return [make](const json &c, const std::string &where) {
        check_verl_advantage(c, where, make(c));
    };
}

const std::map<std::string, CaseCheck> &known_functions() {
    static const std::map<std::string, CaseCheck> k = {
        {"verl/compute_policy_loss_vanilla", verl_vanilla},
        {"verl/agg_loss", verl_agg_loss},
        {"verl/rollout_correction", verl_rollout_correction},
        {"verl/compute_policy_loss_gspo", verl_gspo},
        {"verl/compute_policy_loss_geo_mean", verl_geo_mean},
        {"verl/compute_policy_loss_sapo", verl_sapo},
        {"verl/compute_policy_loss_clip_cov", verl_clip_cov},
        {"verl/compute_policy_loss_kl_cov", verl_kl_cov},
        {"verl/compute_policy_loss_cispo", verl_cispo},
        {"verl/compute_policy_loss_gpg", verl_gpg_loss},
        {"verl/kl_penalty", verl_kl_penalty},
        {"verl/compute_grpo_outcome_advantage", advantage_with([](const json &c) {
             return Estimator{"grpo", grpo_params(c)};
         })},
        {"verl/compute_rloo_outcome_advantage", advantage(Estimator{"rloo", json::object()})},
        // OPO's length-weighted group baseline, no std
        {"verl/compute_opo_outcome_advantage",
         advantage(Estimator{"grpo", {{"norm_by_std", false}, {"length_weighted_mean", true}}})},
        {"verl/compute_gpg_outcome_advantage", advantage_with([](const json &c) {
             return Estimator{"gpg",
                              {{"alpha", "nonzero_rewards"}, {"f_norm", param(c, "f_norm")}}};
         })},
        {"verl/compute_grpo_passk_outcome_advantage", advantage_with([](const json &c) {
             return Estimator{"grpo_passk", grpo_params(c)};
         })},
        {"verl/compute_reinforce_plus_plus_outcome_advantage", advantage_with([](const json &c) {
             return Estimator{"reinforce_pp",
                              {{"gamma", param(c, "gamma")}, {"std_unbiased", true}},
                              false,
                              true,
                              true};
         })},
        // verl returns the whitened advantages as its returns: only advantages compared
        {"verl/compute_reinforce_plus_plus_baseline_outcome_advantage",
         advantage(Estimator{"reinforce_pp",
                             {{"group_baseline", true}, {"std_unbiased", true}},
                             true,
                             false,
                             false})},
        {"verl/compute_remax_outcome_advantage",
         advantage(Estimator{"remax", json::object(), false, true, true})},
        {"verl/compute_gae_advantage_return", advantage_with([](const json &c) {
             return Estimator{"gae",
                              {{"gamma", param(c, "gamma")},
                               {"lambda", param(c, "lam")},
                               {"whiten", true},
                               {"std_unbiased", true}},
                              false,
                              true,
                              true};
         })},
        {"areal/ppo_actor_loss_fn", areal_ppo_actor},
        {"areal/sapo_loss_fn", areal_sapo},
        {"areal/ppo_critic_loss_fn", areal_critic},
        {"areal/Normalization", areal_normalization},
        {"areal/PPOActor._compute_advantages", areal_compute_advantages},
        {"verl/compute_value_loss", verl_value_loss},
        {"areal_legacy/ppo_actor_loss_fn", areal_legacy_ppo_actor},
        {"prime-rl/compute_loss", prime_rl_compute_loss},
        {"xorl/policy_loss_function", xorl_policy_loss},
        {"surogate/compute_grpo_per_token_grads", surogate_grpo},
        {"xorl/importance_sampling_loss_function", xorl_importance_sampling},
        {"xorl/cispo_loss_function", xorl_cispo},
        {"xorl/causallm_loss_function", xorl_causallm},
        {"xorl/drgrpo_loss_function", xorl_drgrpo},
    };
    return k;
}

// Checks every case of one vector file; throws std::runtime_error naming the
// file when it does not parse or names a function this test does not know.
void check_vector_file(const fs::path &path) {
    const json doc = read_vector_file(path);
    const std::string key =
        doc["peer"].get<std::string>() + "/" + doc["function"].get<std::string>();
    const auto it = known_functions().find(key);
    if (it == known_functions().end())
        throw std::runtime_error(path.string() + ": names '" + key +
                                 "', a peer function this test does not map onto a plugin");
    for (const auto &c : doc["cases"]) {
        const std::string where = key + " @ " + doc["commit"].get<std::string>().substr(0, 10) +
                                  ", case " + c["name"].get<std::string>();
        try {
            it->second(c, where);
        } catch (const std::exception &e) {
            ADD_FAILURE() << where << ": " << e.what();
        }
    }
}

std::vector<fs::path> shipped_vector_files() {
    std::vector<fs::path> files;
    if (!fs::is_directory(vectors_dir())) return files;
    for (const auto &e : fs::recursive_directory_iterator(vectors_dir()))
        if (e.is_regular_file()) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    return files;
}

// ---- tests -------------------------------------------------------------------------------

class PeerVector : public ::testing::TestWithParam<std::string> {};

TEST_P(PeerVector, OurPluginMatchesThePeersOwnOutputs) {
    const fs::path path = vectors_dir() / (GetParam() + ".json");
    ASSERT_TRUE(fs::exists(path)) << path << " is missing: run tests/peers/generate.py";
    try {
        check_vector_file(path);
    } catch (const std::exception &e) {
        FAIL() << e.what();
    }
}

std::vector<std::string> known_names() {
    std::vector<std::string> v;
    for (const auto &kv : known_functions()) v.push_back(kv.first);
    return v;
}

INSTANTIATE_TEST_SUITE_P(Peers, PeerVector, ::testing::ValuesIn(known_names()),
                         [](const ::testing::TestParamInfo<std::string> &info) {
                             std::string n = info.param;
                             for (char &ch : n)
                                 if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                             return n;
                         });

TEST(PeerVectors, EveryShippedFileParsesAndNamesAFunctionTheTestMaps) {
    const auto files = shipped_vector_files();
    ASSERT_FALSE(files.empty()) << "no vector files under " << vectors_dir();
    for (const auto &f : files) {
        if (f.extension() != ".json") {
            ADD_FAILURE() << f << ": not a .json vector file";
            continue;
        }
        try {
            const json doc = read_vector_file(f);
            const std::string key =
                doc["peer"].get<std::string>() + "/" + doc["function"].get<std::string>();
            EXPECT_TRUE(known_functions().count(key))
                << f << ": names '" << key << "', which this test does not map onto a plugin";
            EXPECT_EQ(f.parent_path().filename().string() + "/" + f.stem().string(), key)
                << f << ": the file's place does not match its peer and function";
        } catch (const std::exception &e) {
            ADD_FAILURE() << e.what();
        }
    }
}

// A file that does not parse or names an unknown function is an error naming
// the file, never a silent skip.
TEST(PeerVectors, MalformedOrUnknownVectorFileIsRefusedByName) {
    const fs::path dir =
        fs::temp_directory_path() / ("rl_peer_vectors_test." + std::to_string(::getpid()));
    fs::create_directories(dir);
    const fs::path bad = dir / "bad.json", unknown = dir / "unknown.json";
    std::ofstream(bad) << "{\"peer\": \"verl\", \"cases\": [";
    std::ofstream(unknown) << R"({"peer": "verl", "repo": "r", "commit": "c",
        "function": "compute_policy_loss_nonesuch",
        "cases": [{"name": "x", "parameters": {}, "inputs": {}, "outputs": {}}]})";
    try {
        check_vector_file(bad);
        ADD_FAILURE() << "a truncated file was accepted";
    } catch (const std::runtime_error &e) {
        EXPECT_NE(std::string(e.what()).find("bad.json: not valid JSON"), std::string::npos)
            << e.what();
    }
    try {
        check_vector_file(unknown);
        ADD_FAILURE() << "an unknown function was accepted";
    } catch (const std::runtime_error &e) {
        EXPECT_NE(std::string(e.what()).find("verl/compute_policy_loss_nonesuch"),
                  std::string::npos)
            << e.what();
    }
    fs::remove_all(dir);
}

} // namespace
