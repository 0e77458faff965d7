// plugins/envs/jsonl: prompts and reference answers from a user's JSONL file.
// See docs/envs.md.
//
// Each non-blank line: {"prompt": str, "answer": str | number, "metadata":
// object (optional)} (keys renamable with prompt_key / answer_key). The file is
// read and checked at create; a malformed line is an error naming the file and
// the line. Reward in {0, 1}, by `extract`:
//   exact        the trimmed completion equals the trimmed answer
//                (case_sensitive: true)
//   last_number  the last number in the completion equals the answer's number
//   boxed        the content of the completion's last \boxed{...} equals the
//                answer (the answer's own \boxed{} if it has one); numerically
//                when both are numbers, else as trimmed strings
// Numbers compare exactly by value ("1,000" = "1000.0"), or within a relative
// `tolerance` when it is > 0.
#include <rl/sdk/sdk.hpp>

#include <rl/sdk/env.hpp>

#include <cctype>

namespace {

using namespace rl::sdk::env;

std::string lower(std::string_view s) {
    std::string out(s);
    for (char &c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return out;
}

class Jsonl : public rl::sdk::Env {
public:
    explicit Jsonl(rl::sdk::Params &p)
        : path_(p.string("path", "")),
          extract_(p.choice("extract", "exact", {"exact", "last_number", "boxed"})),
          case_sensitive_(p.boolean("case_sensitive", true)),
          tolerance_(p.number("tolerance", 0.0, 0.0, 1.0)), shuffle_(p.boolean("shuffle", true)) {
        const std::string prompt_key = p.string("prompt_key", "prompt");
        const std::string answer_key = p.string("answer_key", "answer");
        if (path_.empty()) invalid(p.owner() + ": parameter 'path' (the JSONL file) is required");
        rows_ = load_jsonl(path_, prompt_key, answer_key, /*answer_required=*/true, p.owner());
        if (extract_ == "last_number") {
            for (const Row &r : rows_) {
                const std::string a =
                    r.answer.is_string() ? r.answer.get<std::string>() : r.answer.dump();
                if (!as_number(a))
                    invalid(p.owner() + ": " + path_ + ":" + std::to_string(r.line) + ": '" +
                            answer_key + "' is not a number ('" + a +
                            "'), which extract: last_number needs");
            }
        }
    }

    json sample(rl::sdk::Call &, uint64_t n, uint64_t seed) override {
        json tasks = json::array();
        for (size_t k : pick_rows(rows_.size(), n, seed, shuffle_)) {
            const Row &r = rows_[k];
            json meta = r.metadata;
            meta["source_line"] = r.line;
            tasks.push_back(make_task(r.prompt, r.answer, meta));
        }
        return tasks;
    }

    double score(rl::sdk::Call &call, const json &task, std::string_view completion) override {
        const std::string answer = task_answer(task, "jsonl");
        std::optional<std::string> got;
        bool correct = false;
        if (extract_ == "exact") {
            const std::string_view t = trim(completion);
            if (!t.empty()) got = std::string(t);
            if (got)
                correct =
                    case_sensitive_ ? *got == trim(answer) : lower(*got) == lower(trim(answer));
        } else if (extract_ == "last_number") {
            const std::vector<std::string> nums = find_numbers(completion);
            const std::optional<std::string> want = as_number(answer);
            if (!want) invalid("env 'jsonl': task 'answer' is not a number: '" + answer + "'");
            if (!nums.empty()) got = nums.back();
            correct = got && numbers_equal(*got, *want, tolerance_);
        } else {
            got = last_boxed(completion);
            const std::string want(trim(last_boxed(answer).value_or(answer)));
            if (got) correct = equal_answers(std::string(trim(*got)), want);
        }
        call.metric("answer_found", got ? 1.0 : 0.0);
        call.metric("correct", correct ? 1.0 : 0.0);
        return correct ? 1.0 : 0.0;
    }

private:
    bool equal_answers(const std::string &got, const std::string &want) const {
        const auto a = as_number(got), b = as_number(want);
        if (a && b) return numbers_equal(*a, *b, tolerance_);
        return case_sensitive_ ? got == want : lower(got) == lower(want);
    }

    std::string path_;
    std::string extract_;
    bool case_sensitive_;
    double tolerance_;
    bool shuffle_;
    std::vector<Row> rows_;
};

} // namespace

RL_PLUGIN_DEFINE(rl::sdk::plugin<Jsonl>(
    "org.rl.env.jsonl", "jsonl", "1.0.0",
    "Prompts and answers from a JSONL file; exact / last-number / \\boxed{} answer matching"))
