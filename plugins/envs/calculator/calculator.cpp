// plugins/envs/calculator: tool use over several turns. A task is an
// arithmetic question the model is not expected to work out itself; it has a
// `calculator` tool (the task's "tools", rendered by a model's own chat
// template). A turn with tool calls (parsed as the model's template family
// writes them: rl/sdk/tool_calls.hpp) gets the results back as a "tool"
// observation; a turn without one is the final answer, rewarded 1 when its
// last number is the result. See docs/envs.md.
#include <rl/sdk/sdk.hpp>

#include <rl/sdk/env.hpp>
#include <rl/sdk/tool_calls.hpp>

#include <limits>

namespace {

using namespace rl::sdk::env;
namespace tools = rl::sdk::tools;

int64_t pow10(int64_t d) {
    int64_t x = 1;
    for (int64_t k = 0; k < d; ++k) x *= 10;
    return x;
}

// Integer arithmetic: + - * /, parentheses, unary minus; "/" must divide
// exactly. Any other character, an overflow or a deep nesting is an error.
class Expr {
public:
    explicit Expr(std::string_view s) : s_(s) {}

    // The value, or the reason it has none.
    std::optional<int64_t> eval(std::string *why) {
        try {
            const int64_t v = sum(0);
            skip();
            if (i_ != s_.size()) fail("unexpected '" + std::string(1, s_[i_]) + "'");
            return v;
        } catch (const std::runtime_error &e) {
            *why = e.what();
            return std::nullopt;
        }
    }

private:
    [[noreturn]] static void fail(const std::string &why) { throw std::runtime_error(why); }
    void skip() {
        while (i_ < s_.size() && is_space(s_[i_])) ++i_;
    }
    bool eat(char c) {
        skip();
        if (i_ < s_.size() && s_[i_] == c) {
            ++i_;
            return true;
        }
        return false;
    }
    static void check(bool overflow) {
        if (overflow) fail("the result overflows 64 bits");
    }
    int64_t sum(int depth) {
        int64_t v = product(depth);
        for (;;) {
            if (eat('+'))
                check(__builtin_add_overflow(v, product(depth), &v));
            else if (eat('-'))
                check(__builtin_sub_overflow(v, product(depth), &v));
            else
                return v;
        }
    }
    int64_t product(int depth) {
        int64_t v = unary(depth);
        for (;;) {
            if (eat('*')) {
                check(__builtin_mul_overflow(v, unary(depth), &v));
            } else if (eat('/')) {
                const int64_t d = unary(depth);
                if (d == 0) fail("division by zero");
                if (d == -1 && v == std::numeric_limits<int64_t>::min())
                    fail("the result overflows 64 bits");
                if (v % d != 0) fail("the division is not exact");
                v /= d;
            } else {
                return v;
            }
        }
    }
    int64_t unary(int depth) {
        if (depth > 64) fail("too deeply nested");
        if (eat('-')) {
            const int64_t v = unary(depth + 1);
            if (v == std::numeric_limits<int64_t>::min()) fail("the result overflows 64 bits");
            return -v;
        }
        if (eat('(')) {
            const int64_t v = sum(depth + 1);
            if (!eat(')')) fail("a '(' is not closed");
            return v;
        }
        skip();
        if (i_ >= s_.size() || !is_digit(s_[i_]))
            fail(i_ >= s_.size() ? std::string("the expression ends early")
                                 : "unexpected '" + std::string(1, s_[i_]) + "'");
        int64_t v = 0;
        while (i_ < s_.size() && is_digit(s_[i_])) {
            const int64_t d = s_[i_++] - '0';
            if (v > (std::numeric_limits<int64_t>::max() - d) / 10) fail("a number is too large");
            v = v * 10 + d;
        }
        return v;
    }

    std::string_view s_;
    size_t i_ = 0;
};

class Calculator : public rl::sdk::Env {
public:
    explicit Calculator(rl::sdk::Params &p)
        : min_digits_(p.integer("min_digits", 2, 1, 9)),
          max_digits_(p.integer("max_digits", 2, 1, 9)),
          max_calls_(p.integer("max_calls", 2, 1, 100)),
          family_(p.choice("family", "hermes", {"hermes", "llama3_json"})),
          format_(p.string("prompt_format", "{expr} = ?\n")),
          reference_tool_rate_(p.number("reference_tool_rate", 1.0, 0.0, 1.0)) {
        if (max_digits_ < min_digits_)
            invalid(p.owner() + ": parameter 'max_digits' (" + std::to_string(max_digits_) +
                    ") must be >= 'min_digits' (" + std::to_string(min_digits_) + ")");
        check_format(p.owner(), "prompt_format", format_, "{expr}");
        tools_ = json::array(
            {{{"type", "function"},
              {"function",
               {{"name", "calculator"},
                {"description", "Evaluates integer arithmetic: + - * / and parentheses."},
                {"parameters",
                 {{"type", "object"},
                  {"properties", {{"expression", {{"type", "string"}}}}},
                  {"required", {"expression"}}}}}}}});
    }

    bool multi_turn() const override { return true; }

    json sample(rl::sdk::Call &, uint64_t n, uint64_t seed) override {
        json tasks = json::array();
        for (uint64_t i = 0; i < n; ++i) {
            Rng rng(seed, i);
            const int64_t a = operand(rng), b = operand(rng);
            const std::string expr = std::to_string(a) + " * " + std::to_string(b);
            const std::string result = std::to_string(a * b);
            // The reference episode calls the tool, or (a share of 1 -
            // reference_tool_rate) answers at once with a rough estimate.
            json reference = {call_text(expr), result};
            if (reference_tool_rate_ < 1.0 &&
                static_cast<double>(rng.uniform(0, 999'999)) >= reference_tool_rate_ * 1e6)
                reference = {std::to_string(estimate(a) * estimate(b))};
            json t = make_task(
                fill(format_, "{expr}", expr), result,
                json{{"expr", expr}, {"result", a * b}, {"reference_turns", std::move(reference)}});
            t["tools"] = tools_;
            tasks.push_back(std::move(t));
        }
        return tasks;
    }

    // A one-turn episode: the final answer without a tool.
    double score(rl::sdk::Call &call, const json &task, std::string_view completion) override {
        const bool right = correct(task, completion);
        call.metric("correct", right ? 1.0 : 0.0);
        return right ? 1.0 : 0.0;
    }

    json step(rl::sdk::Call &call, const json &task, const json &state,
              std::string_view completion) override {
        const int64_t calls = state.is_object() ? state.value("calls", int64_t{0}) : 0;
        const tools::Parsed parsed = tools::parse_tool_calls(completion, family_);
        if (parsed.calls.empty() && parsed.errors.empty()) { // the final answer
            const bool right = correct(task, completion);
            call.metric("correct", right ? 1.0 : 0.0);
            call.metric("tool_calls", static_cast<double>(calls));
            return step_done(right ? 1.0 : 0.0);
        }
        const int64_t now =
            calls + static_cast<int64_t>(parsed.calls.size() + parsed.errors.size());
        call.metric("tool_errors", static_cast<double>(parsed.errors.size()));
        if (now > max_calls_) {
            call.metric("correct", 0.0);
            call.metric("tool_calls", static_cast<double>(now));
            return step_done(0.0);
        }
        // One line per call: its result, or why it has none.
        std::string out;
        for (const std::string &e : parsed.errors) out += e + "\n";
        const tools::json schema = tools::json::parse(tools_.dump());
        for (const tools::ToolCall &c : parsed.calls) {
            const std::vector<std::string> problems = tools::check_call(c, schema);
            if (!problems.empty()) {
                for (const std::string &pr : problems) out += "error: " + pr + "\n";
                continue;
            }
            std::string why;
            const std::string expr = c.arguments["expression"].get<std::string>();
            const std::optional<int64_t> v = Expr(expr).eval(&why);
            out += v ? std::to_string(*v) + "\n" : "error: " + why + "\n";
        }
        return step_continue(out, 0.0, json{{"calls", now}}, "tool");
    }

private:
    int64_t operand(Rng &rng) const {
        const int64_t d = rng.uniform(min_digits_, max_digits_);
        return d == 1 ? rng.uniform(0, 9) : rng.uniform(pow10(d - 1), pow10(d) - 1);
    }

    // x rounded to its leading digit (47 -> 50, 123 -> 100): a guess at a
    // product without the tool.
    static int64_t estimate(int64_t x) {
        int64_t scale = 1;
        while (x / scale >= 10) scale *= 10;
        return (x + scale / 2) / scale * scale;
    }

    // The call as the family writes it (the reference episode's first turn).
    std::string call_text(const std::string &expr) const {
        const std::string args = json{{"expression", expr}}.dump();
        if (family_ == "hermes")
            return "<tool_call>\n{\"name\": \"calculator\", \"arguments\": " + args +
                   "}\n</tool_call>";
        return "{\"name\": \"calculator\", \"parameters\": " + args + "}";
    }

    static bool correct(const json &task, std::string_view completion) {
        const std::vector<std::string> nums = find_numbers(completion);
        return !nums.empty() && numbers_equal(nums.back(), task_answer(task, "calculator"), 0.0);
    }

    int64_t min_digits_, max_digits_, max_calls_;
    std::string family_, format_;
    double reference_tool_rate_;
    json tools_;
};

} // namespace

RL_PLUGIN_DEFINE(rl::sdk::plugin<Calculator>(
    "org.rl.env.calculator", "calculator", "1.0.0",
    "Multi-turn tool use: answer arithmetic questions by calling a calculator tool"))
