// plugins/envs/reverse_text: reverse a short random string. See docs/envs.md.
//
// Task: text = min_len..max_len characters drawn uniformly from `alphabet`;
// prompt = prompt_format with {text} replaced; answer = the text reversed (by
// Unicode code point). Reward in [0, 1]: 2 LCS(answer, reply) / (|answer| +
// |reply|) in code points, where reply is the completion cut at its first
// newline (first_line: true) and trimmed of surrounding whitespace (strip:
// true). 1 only for the exact reversal.
#include <rl/sdk/sdk.hpp>

#include <rl/sdk/env.hpp>

#include <set>

namespace {

using namespace rl::sdk::env;

class ReverseText : public rl::sdk::Env {
public:
    explicit ReverseText(rl::sdk::Params &p)
        : min_len_(p.integer("min_len", 3, 1, 1024)), max_len_(p.integer("max_len", 8, 1, 1024)),
          format_(p.string("prompt_format", "reverse: {text}\n")),
          first_line_(p.boolean("first_line", true)), strip_(p.boolean("strip", true)) {
        if (max_len_ < min_len_)
            invalid(p.owner() + ": parameter 'max_len' (" + std::to_string(max_len_) +
                    ") must be >= 'min_len' (" + std::to_string(min_len_) + ")");
        const std::string alphabet = p.string("alphabet", "abcdefghijklmnopqrstuvwxyz");
        bool ok = true;
        alphabet_ = utf8::decode(alphabet, &ok);
        if (!ok) invalid(p.owner() + ": parameter 'alphabet' is not valid UTF-8");
        if (alphabet_.empty()) invalid(p.owner() + ": parameter 'alphabet' must not be empty");
        std::set<uint32_t> seen;
        for (uint32_t c : alphabet_)
            if (!seen.insert(c).second)
                invalid(p.owner() + ": parameter 'alphabet' repeats the character '" +
                        utf8::encode({c}) + "'");
        check_format(p.owner(), "prompt_format", format_, "{text}");
    }

    json sample(rl::sdk::Call &, uint64_t n, uint64_t seed) override {
        json tasks = json::array();
        for (uint64_t i = 0; i < n; ++i) {
            Rng rng(seed, i);
            const int64_t len = rng.uniform(min_len_, max_len_);
            std::vector<uint32_t> text;
            for (int64_t k = 0; k < len; ++k)
                text.push_back(alphabet_[static_cast<size_t>(
                    rng.uniform(0, static_cast<int64_t>(alphabet_.size()) - 1))]);
            std::vector<uint32_t> rev(text.rbegin(), text.rend());
            const std::string s = utf8::encode(text);
            tasks.push_back(make_task(fill(format_, "{text}", s), utf8::encode(rev),
                                      json{{"text", s}, {"length", len}}));
        }
        return tasks;
    }

    double score(rl::sdk::Call &call, const json &task, std::string_view completion) override {
        const std::string answer = task_answer(task, "reverse_text");
        std::string_view reply = completion;
        if (first_line_) reply = first_line(reply);
        if (strip_) reply = trim(reply);
        const std::vector<uint32_t> want = utf8::decode(answer), got = utf8::decode(reply);
        const double reward = lcs_ratio(want, got);
        call.metric("exact_match", want == got ? 1.0 : 0.0);
        call.metric("reply_chars", static_cast<double>(got.size()));
        return reward;
    }

private:
    int64_t min_len_, max_len_;
    std::string format_;
    bool first_line_, strip_;
    std::vector<uint32_t> alphabet_;
};

} // namespace

RL_PLUGIN_DEFINE(rl::sdk::plugin<ReverseText>(
    "org.rl.env.reverse_text", "reverse_text", "1.0.0",
    "Reverse a short random string; reward = LCS similarity to the reversal, in [0, 1]"))
