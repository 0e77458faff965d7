// plugins/envs/guess_number: a multi-turn game. The env draws a secret integer
// in [lo, hi]; each assistant turn is a guess (the first number in it) and the
// env answers "higher" or "lower" until the guess is right or max_guesses are
// used. Reward: decay^(guesses - 1) for a right guess, else 0, so fewer guesses
// (using the feedback: a binary search needs ceil(log2(hi - lo + 2))) score
// more. consistency_reward (default 0) adds a reward to every wrong guess that
// lies in the range the earlier answers left open. See docs/envs.md.
#include <rl/sdk/sdk.hpp>

#include <rl/sdk/env.hpp>

#include <cmath>

namespace {

using namespace rl::sdk::env;

class GuessNumber : public rl::sdk::Env {
public:
    explicit GuessNumber(rl::sdk::Params &p)
        : lo_(p.integer("lo", 1, -1000000, 1000000)), hi_(p.integer("hi", 16, -1000000, 1000000)),
          max_guesses_(p.integer("max_guesses", 5, 1, 100)),
          decay_(p.number("decay", 0.8, 0.0, 1.0)),
          consistent_(p.number("consistency_reward", 0.0, 0.0, 1.0)),
          format_(p.string("prompt_format", "guess a number from {lo} to {hi}\n")),
          higher_(p.string("higher", "higher\n")), lower_(p.string("lower", "lower\n")),
          no_number_(p.string("no_number", "say a number\n")),
          reference_(p.choice("reference", "random", {"random", "bisect"})) {
        if (hi_ <= lo_)
            invalid(p.owner() + ": parameter 'hi' (" + std::to_string(hi_) + ") must be > 'lo' (" +
                    std::to_string(lo_) + ")");
    }

    bool multi_turn() const override { return true; }

    json sample(rl::sdk::Call &, uint64_t n, uint64_t seed) override {
        json tasks = json::array();
        for (uint64_t i = 0; i < n; ++i) {
            Rng rng(seed, i);
            const int64_t secret = rng.uniform(lo_, hi_);
            std::string prompt = fill(format_, "{lo}", std::to_string(lo_));
            prompt = fill(prompt, "{hi}", std::to_string(hi_));
            tasks.push_back(make_task(std::move(prompt), std::to_string(secret),
                                      json{{"secret", secret},
                                           {"lo", lo_},
                                           {"hi", hi_},
                                           {"reference_turns", reference_turns(rng, secret)}}));
        }
        return tasks;
    }

    // A one-turn episode: right when the first number is the secret.
    double score(rl::sdk::Call &call, const json &task, std::string_view completion) override {
        const bool right = guess_of(completion) == secret_of(task);
        call.metric("solved", right ? 1.0 : 0.0);
        return right ? 1.0 : 0.0;
    }

    json step(rl::sdk::Call &call, const json &task, const json &state,
              std::string_view completion) override {
        const int64_t secret = secret_of(task);
        const bool first = !state.is_object();
        const int64_t guesses = (first ? 0 : state.value("guesses", int64_t{0})) + 1;
        // The range the answers so far leave open.
        int64_t a = first ? lo_ : state.value("a", lo_), b = first ? hi_ : state.value("b", hi_);
        const std::optional<int64_t> guess = guess_of(completion);
        const bool right = guess == secret;
        const bool consistent = guess && *guess >= a && *guess <= b;
        call.metric("solved", right ? 1.0 : 0.0);
        call.metric("guesses", static_cast<double>(guesses));
        call.metric("valid_guess", guess ? 1.0 : 0.0);
        if (right) return step_done(std::pow(decay_, static_cast<double>(guesses - 1)));
        const double reward = consistent ? consistent_ : 0.0;
        if (guesses >= max_guesses_) return step_done(reward);
        if (guess && *guess < secret) a = std::max(a, *guess + 1);
        if (guess && *guess > secret) b = std::min(b, *guess - 1);
        const json next{{"guesses", guesses}, {"a", a}, {"b", b}};
        if (!guess) return step_continue(no_number_, reward, next);
        return step_continue(*guess < secret ? higher_ : lower_, reward, next);
    }

private:
    // A reference episode for the supervised warm-up: the guesses of a player
    // that draws each guess uniformly among the numbers not yet guessed
    // ("random": the turn format, no use of the feedback) or halves the
    // range the answers leave ("bisect"), until right or out of guesses.
    json reference_turns(Rng &rng, int64_t secret) const {
        json turns = json::array();
        std::vector<int64_t> left;
        for (int64_t v = lo_; v <= hi_ && left.size() < 4096; ++v) left.push_back(v);
        int64_t a = lo_, b = hi_;
        for (int64_t k = 0; k < max_guesses_; ++k) {
            int64_t g = 0;
            if (reference_ == "bisect") {
                g = a + (b - a) / 2;
            } else {
                const size_t at =
                    static_cast<size_t>(rng.uniform(0, static_cast<int64_t>(left.size()) - 1));
                g = left[at];
                left.erase(left.begin() + static_cast<std::ptrdiff_t>(at));
            }
            turns.push_back(std::to_string(g));
            if (g == secret || left.empty()) break;
            if (g < secret)
                a = g + 1;
            else
                b = g - 1;
        }
        return turns;
    }

    static int64_t secret_of(const json &task) {
        const json *m = task.is_object() && task.contains("metadata") ? &task["metadata"] : nullptr;
        if (m == nullptr || !m->contains("secret") || !(*m)["secret"].is_number_integer())
            invalid("env 'guess_number': task has no integer metadata.secret");
        return (*m)["secret"].get<int64_t>();
    }

    // The first integer of the turn (a number with a fraction is not a guess).
    static std::optional<int64_t> guess_of(std::string_view completion) {
        const std::vector<std::string> nums = find_numbers(completion);
        if (nums.empty()) return std::nullopt;
        const std::string canon = canonical_number(nums.front());
        if (canon.find('.') != std::string::npos || canon.size() > 12) return std::nullopt;
        return std::stoll(canon);
    }

    int64_t lo_, hi_, max_guesses_;
    double decay_, consistent_;
    std::string format_, higher_, lower_, no_number_, reference_;
};

} // namespace

RL_PLUGIN_DEFINE(rl::sdk::plugin<GuessNumber>(
    "org.rl.env.guess_number", "guess_number", "1.0.0",
    "Multi-turn: guess a secret number with higher / lower feedback each turn"))
