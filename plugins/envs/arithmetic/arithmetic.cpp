// plugins/envs/arithmetic: integer arithmetic with a configurable number of
// digits. See docs/envs.md.
//
// Task: two non-negative operands of min_digits..max_digits digits each (the
// digit count drawn per operand; 1 digit means 0..9), one operator drawn from
// `operators`. "-" keeps the result >= 0 unless allow_negative; "/" draws the
// divisor and the quotient, so the division is exact (the dividend may have
// more digits). answer = the exact integer result. Reward in {0, 1}: 1 when
// the number extracted from the completion (extract: last_number,
// first_number, or exact = the whole trimmed completion) equals the result.
#include <rl/sdk/sdk.hpp>

#include <rl/sdk/env.hpp>

namespace {

using namespace rl::sdk::env;

int64_t pow10(int64_t d) {
    int64_t x = 1;
    for (int64_t k = 0; k < d; ++k) x *= 10;
    return x;
}

class Arithmetic : public rl::sdk::Env {
public:
    explicit Arithmetic(rl::sdk::Params &p)
        : min_digits_(p.integer("min_digits", 1, 1, 9)),
          max_digits_(p.integer("max_digits", 2, 1, 9)),
          allow_negative_(p.boolean("allow_negative", false)),
          format_(p.string("prompt_format", "{expr} = ")),
          extract_(p.choice("extract", "last_number", {"last_number", "first_number", "exact"})) {
        if (max_digits_ < min_digits_)
            invalid(p.owner() + ": parameter 'max_digits' (" + std::to_string(max_digits_) +
                    ") must be >= 'min_digits' (" + std::to_string(min_digits_) + ")");
        check_format(p.owner(), "prompt_format", format_, "{expr}");
        const json ops = p.raw("operators");
        if (ops.is_null()) {
            ops_ = {'+', '-', '*'};
        } else {
            if (!ops.is_array() || ops.empty())
                invalid(p.owner() +
                        ": parameter 'operators' must be a non-empty array of \"+\", "
                        "\"-\", \"*\", \"/\", got " +
                        dump(ops));
            for (const auto &o : ops) {
                const std::string s = o.is_string() ? o.get<std::string>() : std::string();
                if (s != "+" && s != "-" && s != "*" && s != "/")
                    invalid(p.owner() + ": parameter 'operators' holds " + dump(o) +
                            "; allowed: \"+\", \"-\", \"*\", \"/\"");
                if (std::find(ops_.begin(), ops_.end(), s[0]) != ops_.end())
                    invalid(p.owner() + ": parameter 'operators' repeats " + dump(o));
                ops_.push_back(s[0]);
            }
        }
    }

    json sample(rl::sdk::Call &, uint64_t n, uint64_t seed) override {
        json tasks = json::array();
        for (uint64_t i = 0; i < n; ++i) {
            Rng rng(seed, i);
            const char op =
                ops_[static_cast<size_t>(rng.uniform(0, static_cast<int64_t>(ops_.size()) - 1))];
            int64_t a = operand(rng), b = operand(rng), result = 0;
            switch (op) {
                case '+':
                    result = a + b;
                    break;
                case '-':
                    if (!allow_negative_ && a < b) std::swap(a, b);
                    result = a - b;
                    break;
                case '*':
                    result = a * b;
                    break;
                default: // '/': b is the divisor (never 0), the quotient is drawn
                    while (b == 0) b = operand(rng);
                    result = a;
                    a = result * b;
                    break;
            }
            const std::string expr =
                std::to_string(a) + " " + std::string(1, op) + " " + std::to_string(b);
            tasks.push_back(make_task(
                fill(format_, "{expr}", expr), std::to_string(result),
                json{{"a", a}, {"b", b}, {"op", std::string(1, op)}, {"result", result}}));
        }
        return tasks;
    }

    double score(rl::sdk::Call &call, const json &task, std::string_view completion) override {
        const std::string answer = task_answer(task, "arithmetic");
        if (!as_number(answer))
            invalid("env 'arithmetic': task 'answer' is not a number: '" + answer + "'");
        std::optional<std::string> got;
        if (extract_ == "exact") {
            const std::string_view t = trim(completion);
            if (!t.empty()) got = std::string(t);
        } else {
            const std::vector<std::string> nums = find_numbers(completion);
            if (!nums.empty()) got = extract_ == "last_number" ? nums.back() : nums.front();
        }
        bool correct = false;
        if (got) {
            if (extract_ == "exact")
                correct = *got == trim(answer);
            else
                correct = numbers_equal(*got, *as_number(answer), 0.0);
        }
        call.metric("answer_found", got ? 1.0 : 0.0);
        call.metric("correct", correct ? 1.0 : 0.0);
        return correct ? 1.0 : 0.0;
    }

private:
    int64_t operand(Rng &rng) {
        const int64_t d = rng.uniform(min_digits_, max_digits_);
        return d == 1 ? rng.uniform(0, 9) : rng.uniform(pow10(d - 1), pow10(d) - 1);
    }

    int64_t min_digits_, max_digits_;
    bool allow_negative_;
    std::string format_;
    std::string extract_;
    std::vector<char> ops_;
};

} // namespace

RL_PLUGIN_DEFINE(rl::sdk::plugin<Arithmetic>(
    "org.rl.env.arithmetic", "arithmetic", "1.0.0",
    "Integer arithmetic with configurable digits and operators; exact-answer reward in {0, 1}"))
