// tests/envs: the environment plugins through the C ABI of the built
// libraries: deterministic sampling, rewards on known and malformed answers,
// and the `command` env against verifiers that hang, crash or print garbage.
#include "dl_plugin_host.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <dirent.h>
#include <fstream>
#include <set>
#include <sstream>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>

namespace {

using json = nlohmann::json;
using rltest::Instance;
using rltest::Outputs;
using Clock = std::chrono::steady_clock;

std::unique_ptr<Instance> make(const std::string &name, const json &params = json::object()) {
    return std::make_unique<Instance>(rltest::load("env-" + name), params.dump());
}
Outputs create_status(const std::string &name, const json &params) {
    return Instance::create_status(rltest::load("env-" + name), params.dump());
}

json tasks_of(const Instance &env, uint64_t n, uint64_t seed) {
    Outputs o = env.sample(n, seed);
    EXPECT_TRUE(o.ok()) << o.error;
    return json::parse(o.texts["tasks"]);
}

struct Scored {
    Outputs out;
    double reward = 0;
};
Scored score(const Instance &env, const json &task, const std::string &completion,
             const volatile int32_t *abort_flag = nullptr) {
    Scored s;
    s.out = env.score(task.dump(), completion, &s.reward, abort_flag);
    return s;
}

std::string verifier(const std::string &name) {
    return std::string(RL_TEST_SOURCE_DIR) + "/tests/envs/verifiers/" + name;
}

std::string temp_dir() {
    static std::string dir = [] {
        std::string t = ::testing::TempDir() + "rl_envs_XXXXXX";
        std::vector<char> buf(t.begin(), t.end());
        buf.push_back('\0');
        const char *d = ::mkdtemp(buf.data());
        return std::string(d ? d : "/tmp");
    }();
    return dir;
}

std::string write_file(const std::string &name, const std::string &text) {
    const std::string path = temp_dir() + "/" + name;
    std::ofstream(path, std::ios::binary) << text;
    return path;
}

// ---- process bookkeeping (Linux /proc) ------------------------------------------

size_t open_fds() {
    size_t n = 0;
    if (DIR *d = ::opendir("/proc/self/fd")) {
        while (::readdir(d)) ++n;
        ::closedir(d);
    }
    return n;
}

// State letter of a process ('Z' zombie), or 0 when it does not exist.
char proc_state(long pid, long *ppid = nullptr) {
    std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
    std::string s;
    if (!std::getline(f, s)) return 0;
    const size_t rp = s.rfind(')');
    if (rp == std::string::npos || rp + 2 >= s.size()) return 0;
    std::istringstream rest(s.substr(rp + 2));
    char state = 0;
    long pp = 0;
    rest >> state >> pp;
    if (ppid) *ppid = pp;
    return state;
}

// Children of this process, zombies included (an unreaped child is a leak).
std::vector<long> my_children() {
    std::vector<long> out;
    const long me = static_cast<long>(::getpid());
    if (DIR *d = ::opendir("/proc")) {
        while (dirent *e = ::readdir(d)) {
            char *end = nullptr;
            const long pid = std::strtol(e->d_name, &end, 10);
            if (!end || *end != '\0' || pid <= 0) continue;
            long ppid = 0;
            if (proc_state(pid, &ppid) && ppid == me) out.push_back(pid);
        }
        ::closedir(d);
    }
    return out;
}

// Dead: gone, or a zombie waiting for someone else's wait().
bool dies_within(long pid, std::chrono::milliseconds limit) {
    const auto until = Clock::now() + limit;
    for (;;) {
        const char st = proc_state(pid);
        if (st == 0 || st == 'Z' || st == 'X') return true;
        if (Clock::now() > until) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
}

// ---- reverse_text --------------------------------------------------------------------

TEST(ReverseText, SamplingIsDeterministicAndPrefixStable) {
    auto env = make("reverse_text");
    const json a = tasks_of(*env, 6, 42), b = tasks_of(*env, 6, 42), c = tasks_of(*env, 3, 42);
    EXPECT_EQ(a, b);
    ASSERT_EQ(a.size(), 6u);
    for (size_t i = 0; i < 3; ++i) EXPECT_EQ(a[i], c[i]);
    EXPECT_NE(a, tasks_of(*env, 6, 43));
}

TEST(ReverseText, TasksHoldPromptReferenceAnswerAndMetadata) {
    auto env =
        make("reverse_text",
             {{"min_len", 4}, {"max_len", 6}, {"alphabet", "xyz"}, {"prompt_format", "<{text}>"}});
    std::set<size_t> lengths;
    for (const json &t : tasks_of(*env, 200, 1)) {
        const std::string text = t["metadata"]["text"];
        lengths.insert(text.size());
        EXPECT_GE(text.size(), 4u);
        EXPECT_LE(text.size(), 6u);
        EXPECT_EQ(text.find_first_not_of("xyz"), std::string::npos) << text;
        EXPECT_EQ(t["prompt"], "<" + text + ">");
        EXPECT_EQ(t["answer"], std::string(text.rbegin(), text.rend()));
    }
    EXPECT_EQ(lengths, (std::set<size_t>{4, 5, 6}));
}

TEST(ReverseText, ExactReversalScoresOneAndPartialScoresLcsRatio) {
    auto env = make("reverse_text");
    const json task = {{"prompt", "reverse: abcd\n"}, {"answer", "dcba"}, {"metadata", {}}};
    Scored s = score(*env, task, "dcba");
    ASSERT_TRUE(s.out.ok()) << s.out.error;
    EXPECT_EQ(s.reward, 1.0);
    EXPECT_EQ(s.out.metrics["exact_match"], 1.0);
    // Only the first line counts, trimmed.
    EXPECT_EQ(score(*env, task, "  dcba \nsomething else").reward, 1.0);
    // LCS("dcba", "dcab") = 3: 2 * 3 / 8.
    EXPECT_DOUBLE_EQ(score(*env, task, "dcab").reward, 0.75);
    // LCS("dcba", "dcbaxx") = 4: 2 * 4 / 10.
    EXPECT_DOUBLE_EQ(score(*env, task, "dcbaxx").reward, 0.8);
    EXPECT_EQ(score(*env, task, "").reward, 0.0);
    EXPECT_EQ(score(*env, task, "zzzz").reward, 0.0);
}

TEST(ReverseText, UnicodeAlphabetReversesByCodePoint) {
    auto env = make("reverse_text", {{"alphabet", "äöü"}, {"min_len", 2}, {"max_len", 2}});
    const json t = tasks_of(*env, 1, 5)[0];
    const std::string text = t["metadata"]["text"];
    ASSERT_EQ(text.size(), 4u); // two 2-byte characters
    EXPECT_EQ(t["answer"], text.substr(2, 2) + text.substr(0, 2));
    EXPECT_EQ(score(*env, t, t["answer"].get<std::string>()).reward, 1.0);
}

TEST(ReverseText, InvalidUtf8CompletionIsALowRewardNotAnError) {
    auto env = make("reverse_text");
    const json task = {{"prompt", "x"}, {"answer", "ab"}, {"metadata", {}}};
    Scored s = score(*env, task, std::string("a\xff\xfe", 3));
    ASSERT_TRUE(s.out.ok()) << s.out.error;
    EXPECT_DOUBLE_EQ(s.reward, 2.0 * 1 / 5);
}

TEST(ReverseText, TaskWithoutAnswerOrNotJsonIsRefused) {
    auto env = make("reverse_text");
    Scored s = score(*env, json{{"prompt", "x"}}, "ab");
    EXPECT_EQ(s.out.status, RL_ERR_INVALID_ARG);
    EXPECT_NE(s.out.error.find("answer"), std::string::npos) << s.out.error;
    double r = 0;
    Outputs o = env->score("{not json", "ab", &r);
    EXPECT_EQ(o.status, RL_ERR_INVALID_ARG);
}

TEST(ReverseText, BadParametersAreNamed) {
    Outputs o = create_status("reverse_text", {{"min_len", 5}, {"max_len", 2}});
    EXPECT_EQ(o.status, RL_ERR_INVALID_ARG);
    EXPECT_NE(o.error.find("max_len"), std::string::npos) << o.error;
    o = create_status("reverse_text", {{"alphabet", "abca"}});
    EXPECT_NE(o.error.find("repeats"), std::string::npos) << o.error;
    o = create_status("reverse_text", {{"prompt_format", "no placeholder"}});
    EXPECT_NE(o.error.find("{text}"), std::string::npos) << o.error;
    o = create_status("reverse_text", {{"alphabet", ""}});
    EXPECT_NE(o.error.find("alphabet"), std::string::npos) << o.error;
}

// ---- arithmetic ------------------------------------------------------------------------

TEST(Arithmetic, TasksAreDeterministicAndAnswersAreCorrect) {
    auto env = make("arithmetic",
                    {{"min_digits", 1}, {"max_digits", 3}, {"operators", {"+", "-", "*", "/"}}});
    const json tasks = tasks_of(*env, 300, 9);
    EXPECT_EQ(tasks, tasks_of(*env, 300, 9));
    std::set<std::string> ops;
    for (const json &t : tasks) {
        const int64_t a = t["metadata"]["a"], b = t["metadata"]["b"];
        const std::string op = t["metadata"]["op"];
        ops.insert(op);
        int64_t want = op == "+" ? a + b : op == "-" ? a - b : op == "*" ? a * b : a / b;
        if (op == "/") {
            EXPECT_NE(b, 0);
            EXPECT_EQ(a % b, 0) << a << " / " << b;
        } else {
            EXPECT_LT(a, 1000);
        }
        EXPECT_LT(b, 1000);
        EXPECT_GE(want, 0); // allow_negative is false by default
        EXPECT_EQ(t["answer"], std::to_string(want));
        EXPECT_EQ(t["prompt"], std::to_string(a) + " " + op + " " + std::to_string(b) + " = ");
    }
    EXPECT_EQ(ops.size(), 4u);
}

TEST(Arithmetic, DigitCountsAreRespected) {
    auto env = make("arithmetic", {{"min_digits", 3}, {"max_digits", 3}, {"operators", {"+"}}});
    for (const json &t : tasks_of(*env, 100, 3)) {
        EXPECT_GE(t["metadata"]["a"].get<int64_t>(), 100);
        EXPECT_LE(t["metadata"]["a"].get<int64_t>(), 999);
    }
}

TEST(Arithmetic, ExactAnswerRewardOnKnownAndMalformedAnswers) {
    auto env = make("arithmetic");
    const json task = {{"prompt", "40 + 2 = "}, {"answer", "42"}, {"metadata", {}}};
    EXPECT_EQ(score(*env, task, "42").reward, 1.0);
    EXPECT_EQ(score(*env, task, "I think 40 + 2 is 42.").reward, 1.0);
    EXPECT_EQ(score(*env, task, "42.0").reward, 1.0);
    EXPECT_EQ(score(*env, task, "43").reward, 0.0);
    EXPECT_EQ(score(*env, task, "42 or maybe 41").reward, 0.0); // last number counts
    Scored none = score(*env, task, "forty-two");
    ASSERT_TRUE(none.out.ok());
    EXPECT_EQ(none.reward, 0.0);
    EXPECT_EQ(none.out.metrics["answer_found"], 0.0);
    const json neg = {{"prompt", "1 - 6 = "}, {"answer", "-5"}, {"metadata", {}}};
    EXPECT_EQ(score(*env, neg, "-5").reward, 1.0);
    EXPECT_EQ(score(*env, neg, "5").reward, 0.0);
}

TEST(Arithmetic, ExtractModes) {
    const json task = {{"prompt", "x"}, {"answer", "42"}, {"metadata", {}}};
    auto first = make("arithmetic", {{"extract", "first_number"}});
    EXPECT_EQ(score(*first, task, "42 or maybe 41").reward, 1.0);
    auto exact = make("arithmetic", {{"extract", "exact"}});
    EXPECT_EQ(score(*exact, task, " 42\n").reward, 1.0);
    EXPECT_EQ(score(*exact, task, "42.").reward, 0.0);
}

TEST(Arithmetic, MalformedTaskAnswerIsAnError) {
    auto env = make("arithmetic");
    Scored s = score(*env, json{{"prompt", "x"}, {"answer", "many"}}, "42");
    EXPECT_EQ(s.out.status, RL_ERR_INVALID_ARG);
    EXPECT_NE(s.out.error.find("many"), std::string::npos) << s.out.error;
}

TEST(Arithmetic, BadOperatorsAreRefused) {
    Outputs o = create_status("arithmetic", {{"operators", {"+", "^"}}});
    EXPECT_EQ(o.status, RL_ERR_INVALID_ARG);
    EXPECT_NE(o.error.find("\"^\""), std::string::npos) << o.error;
    o = create_status("arithmetic", {{"max_digits", 10}});
    EXPECT_NE(o.error.find("max_digits"), std::string::npos) << o.error;
}

// ---- jsonl ------------------------------------------------------------------------------

const char *kRows = R"({"prompt": "Capital of France?", "answer": "Paris"}
{"prompt": "2 + 2?", "answer": 4, "metadata": {"level": 1}}

{"prompt": "Half of 1?", "answer": "\\frac{1}{2}"}
)";

TEST(Jsonl, SamplesEveryRowOncePerEpochDeterministically) {
    auto env = make("jsonl", {{"path", write_file("rows.jsonl", kRows)}});
    const json a = tasks_of(*env, 6, 11);
    EXPECT_EQ(a, tasks_of(*env, 6, 11));
    std::multiset<std::string> first, second;
    for (size_t i = 0; i < 3; ++i) first.insert(a[i]["prompt"].get<std::string>());
    for (size_t i = 3; i < 6; ++i) second.insert(a[i]["prompt"].get<std::string>());
    EXPECT_EQ(first.size(), 3u);
    EXPECT_EQ(std::set<std::string>(first.begin(), first.end()).size(), 3u);
    EXPECT_EQ(first, second);
    for (const json &t : a) {
        if (t["prompt"] == "2 + 2?") {
            EXPECT_EQ(t["answer"], 4);
            EXPECT_EQ(t["metadata"]["level"], 1);
            EXPECT_EQ(t["metadata"]["source_line"], 2);
        }
    }
}

TEST(Jsonl, UnshuffledSamplingFollowsTheFile) {
    auto env = make("jsonl", {{"path", write_file("rows.jsonl", kRows)}, {"shuffle", false}});
    const json a = tasks_of(*env, 4, 99);
    EXPECT_EQ(a[0]["prompt"], "Capital of France?");
    EXPECT_EQ(a[2]["metadata"]["source_line"], 4);
    EXPECT_EQ(a[3]["prompt"], "Capital of France?");
}

TEST(Jsonl, ExactMatchScoring) {
    auto env = make("jsonl", {{"path", write_file("rows.jsonl", kRows)}});
    const json t = {{"prompt", "Capital of France?"}, {"answer", "Paris"}, {"metadata", {}}};
    EXPECT_EQ(score(*env, t, "  Paris\n").reward, 1.0);
    EXPECT_EQ(score(*env, t, "paris").reward, 0.0);
    EXPECT_EQ(score(*env, t, "It is Paris").reward, 0.0);
    auto ci = make("jsonl", {{"path", write_file("rows.jsonl", kRows)}, {"case_sensitive", false}});
    EXPECT_EQ(score(*ci, t, "PARIS").reward, 1.0);
}

TEST(Jsonl, LastNumberScoring) {
    const std::string path = write_file("nums.jsonl", "{\"prompt\": \"q\", \"answer\": \"1234\"}\n"
                                                      "{\"prompt\": \"r\", \"answer\": 0.5}\n");
    auto env = make("jsonl", {{"path", path}, {"extract", "last_number"}});
    const json t = {{"prompt", "q"}, {"answer", "1234"}, {"metadata", {}}};
    EXPECT_EQ(score(*env, t, "First 12, then the total is 1,234.").reward, 1.0);
    EXPECT_EQ(score(*env, t, "1234.00").reward, 1.0);
    EXPECT_EQ(score(*env, t, "1234 then 5").reward, 0.0);
    EXPECT_EQ(score(*env, t, "x1234").reward, 0.0); // a number glued to a word is not one
    const json half = {{"prompt", "r"}, {"answer", 0.5}, {"metadata", {}}};
    EXPECT_EQ(score(*env, half, "0.50").reward, 1.0);
    EXPECT_EQ(score(*env, half, "1/2").reward, 0.0);
}

TEST(Jsonl, BoxedScoring) {
    auto env = make("jsonl", {{"path", write_file("rows.jsonl", kRows)}, {"extract", "boxed"}});
    const json frac = {{"prompt", "q"}, {"answer", "\\frac{1}{2}"}, {"metadata", {}}};
    EXPECT_EQ(score(*env, frac, "so \\boxed{ \\frac{1}{2} }").reward, 1.0);
    EXPECT_EQ(score(*env, frac, "\\boxed{3} no wait \\boxed{\\frac{1}{3}}").reward, 0.0);
    EXPECT_EQ(score(*env, frac, "\\boxed{\\frac{1}{2}").reward, 0.0); // never closed
    Scored none = score(*env, frac, "1/2");
    EXPECT_EQ(none.reward, 0.0);
    EXPECT_EQ(none.out.metrics["answer_found"], 0.0);
    const json num = {{"prompt", "q"}, {"answer", 4}, {"metadata", {}}};
    EXPECT_EQ(score(*env, num, "\\boxed{4.0}").reward, 1.0);
    const json boxed_ref = {
        {"prompt", "q"}, {"answer", "The answer: \\boxed{7}"}, {"metadata", {}}};
    EXPECT_EQ(score(*env, boxed_ref, "\\boxed{7}").reward, 1.0);
}

TEST(Jsonl, MalformedLinesNameTheFileAndLine) {
    struct Case {
        std::string text, needle;
    };
    const std::vector<Case> cases = {
        {"{\"prompt\": \"a\", \"answer\": \"b\"}\n\n{\"prompt\": \"a\", \"answer\": \n", ":3:"},
        {"{\"prompt\": \"a\", \"answer\": \"b\"}\n[1, 2]\n", ":2: expected a JSON object"},
        {"{\"answer\": \"b\"}\n", ":1: missing 'prompt'"},
        {"{\"prompt\": 5, \"answer\": \"b\"}\n", ":1: 'prompt' must be a string"},
        {"{\"prompt\": \"a\"}\n", ":1: missing 'answer'"},
        {"{\"prompt\": \"a\", \"answer\": [1]}\n", ":1: 'answer' must be a string or a number"},
        {"{\"prompt\": \"a\", \"answer\": \"b\", \"metadata\": 3}\n", ":1: 'metadata'"},
    };
    int k = 0;
    for (const Case &c : cases) {
        const std::string path = write_file("bad" + std::to_string(k++) + ".jsonl", c.text);
        Outputs o = create_status("jsonl", {{"path", path}});
        EXPECT_EQ(o.status, RL_ERR_INVALID_ARG) << c.text;
        EXPECT_NE(o.error.find(path + c.needle), std::string::npos) << o.error;
    }
}

TEST(Jsonl, MissingEmptyOrNonNumericFilesAreRefused) {
    Outputs o = create_status("jsonl", {{"path", temp_dir() + "/nope.jsonl"}});
    EXPECT_EQ(o.status, RL_ERR_NOT_FOUND);
    EXPECT_NE(o.error.find("nope.jsonl"), std::string::npos) << o.error;
    o = create_status("jsonl", {{"path", write_file("empty.jsonl", "\n  \n")}});
    EXPECT_EQ(o.status, RL_ERR_INVALID_ARG);
    EXPECT_NE(o.error.find("no tasks"), std::string::npos) << o.error;
    o = create_status("jsonl",
                      {{"path", write_file("rows.jsonl", kRows)}, {"extract", "last_number"}});
    EXPECT_EQ(o.status, RL_ERR_INVALID_ARG);
    EXPECT_NE(o.error.find("rows.jsonl:1:"), std::string::npos) << o.error;
    o = create_status("jsonl", json::object());
    EXPECT_NE(o.error.find("'path'"), std::string::npos) << o.error;
}

// ---- multi-turn: guess_number, calculator --------------------------------------------------

// One step: the env's result object.
json step_of(const Instance &env, const json &task, const json &state, const std::string &turn) {
    Outputs o = env.step(task.dump(), state.dump(), turn);
    EXPECT_TRUE(o.ok()) << o.error;
    return o.ok() ? json::parse(o.texts["state"]) : json();
}

TEST(GuessNumberEnv, AnswersHigherOrLowerAndRewardsFewerGuesses) {
    auto env = make("guess_number",
                    {{"lo", 1}, {"hi", 8}, {"max_guesses", 3}, {"consistency_reward", 0.1}});
    const json task = {{"prompt", "guess"}, {"metadata", {{"secret", 6}}}};
    json r = step_of(*env, task, nullptr, "3\n");
    EXPECT_EQ(r["done"], false);
    EXPECT_EQ(r["observation"], "higher\n");
    EXPECT_DOUBLE_EQ(r["reward"].get<double>(), 0.1); // in the open range 1..8
    r = step_of(*env, task, r["state"], "2");         // below what "higher" left open: 4..8
    EXPECT_EQ(r["observation"], "higher\n");
    EXPECT_DOUBLE_EQ(r["reward"].get<double>(), 0.0);
    r = step_of(*env, task, r["state"], "6");
    EXPECT_EQ(r["done"], true);
    EXPECT_NEAR(r["reward"].get<double>(), 0.64, 1e-12); // right at the third guess: 0.8^2
    // Out of guesses: done with nothing; no number: told so.
    r = step_of(*env, task, json{{"guesses", 2}, {"a", 4}, {"b", 8}}, "7");
    EXPECT_EQ(r["done"], true);
    EXPECT_DOUBLE_EQ(r["reward"].get<double>(), 0.1);
    EXPECT_EQ(step_of(*env, task, nullptr, "no idea")["observation"], "say a number\n");
}

TEST(GuessNumberEnv, ReferenceEpisodesEndOnTheSecretOrOutOfGuesses) {
    for (const char *how : {"random", "bisect"}) {
        auto env =
            make("guess_number", {{"lo", 1}, {"hi", 16}, {"max_guesses", 5}, {"reference", how}});
        for (const json &t : tasks_of(*env, 32, 7)) {
            const json &turns = t["metadata"]["reference_turns"];
            const std::string secret = std::to_string(t["metadata"]["secret"].get<int64_t>());
            ASSERT_GE(turns.size(), 1u);
            ASSERT_LE(turns.size(), 5u);
            std::set<std::string> seen;
            for (size_t k = 0; k < turns.size(); ++k) {
                EXPECT_TRUE(seen.insert(turns[k].get<std::string>()).second) << "repeated guess";
                if (k + 1 < turns.size()) {
                    EXPECT_NE(turns[k], secret);
                }
            }
            // Bisection over 16 numbers always finds the secret within 5 guesses.
            if (std::string(how) == "bisect") {
                EXPECT_EQ(turns.back(), secret);
            }
        }
    }
}

TEST(CalculatorEnv, ToolCallsGetResultsAndTheFinalAnswerIsScored) {
    auto env = make("calculator");
    const json tasks = tasks_of(*env, 3, 1);
    const json &t = tasks[0];
    ASSERT_TRUE(t["tools"].is_array());
    EXPECT_EQ(t["tools"][0]["function"]["name"], "calculator");
    const json &ref = t["metadata"]["reference_turns"];
    ASSERT_EQ(ref.size(), 2u);
    // The reference call gets the task's result back, as a tool message.
    json r = step_of(*env, t, nullptr, ref[0].get<std::string>());
    EXPECT_EQ(r["done"], false);
    EXPECT_EQ(r["role"], "tool");
    EXPECT_EQ(r["observation"], t["answer"].get<std::string>() + "\n");
    EXPECT_EQ(ref[1], t["answer"]);
    // Arithmetic as written: precedence, parentheses, exact division.
    const auto call = [](const std::string &expr) {
        return "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"" + expr +
               "\"}}\n</tool_call>";
    };
    EXPECT_EQ(step_of(*env, t, nullptr, call("2 + 3 * (4 - 6)"))["observation"], "-4\n");
    EXPECT_EQ(step_of(*env, t, nullptr, call("84 / 4 * 2"))["observation"], "42\n");
    EXPECT_EQ(step_of(*env, t, nullptr, call("7 / 2"))["observation"],
              "error: the division is not exact\n");
    EXPECT_EQ(step_of(*env, t, nullptr, call("9223372036854775807 * 2"))["observation"],
              "error: the result overflows 64 bits\n");
    EXPECT_EQ(step_of(*env, t, nullptr, call("1 +"))["observation"],
              "error: the expression ends early\n");
    // Malformed calls and unknown tools are observations, never errors.
    const std::string bad = step_of(*env, t, nullptr, "<tool_call>\n{\"name\": ")["observation"];
    EXPECT_NE(bad.find("could not parse tool call 1"), std::string::npos) << bad;
    const std::string unknown =
        step_of(*env, t, nullptr,
                "<tool_call>{\"name\": \"search\", \"arguments\": {}}</tool_call>")["observation"];
    EXPECT_NE(unknown.find("unknown tool 'search'"), std::string::npos) << unknown;
    // The final answer: its last number against the result.
    r = step_of(*env, t, json{{"calls", 1}}, "it is " + t["answer"].get<std::string>());
    EXPECT_EQ(r["done"], true);
    EXPECT_DOUBLE_EQ(r["reward"].get<double>(), 1.0);
    r = step_of(*env, t, json{{"calls", 1}}, "it is 1");
    EXPECT_DOUBLE_EQ(r["reward"].get<double>(), 0.0);
    // More calls than max_calls end the episode with nothing.
    r = step_of(*env, t, json{{"calls", 2}}, call("1 + 1"));
    EXPECT_EQ(r["done"], true);
    EXPECT_DOUBLE_EQ(r["reward"].get<double>(), 0.0);
}

TEST(CalculatorEnv, AShareOfReferenceEpisodesAnswersWithoutTheTool) {
    // The same tasks with every reference calling the tool, and with about
    // half of them answering at once with the operands' leading-digit estimate.
    auto all = make("calculator");
    auto half = make("calculator", {{"reference_tool_rate", 0.5}});
    const json a = tasks_of(*all, 200, 3), b = tasks_of(*half, 200, 3);
    int direct = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_EQ(a[i]["prompt"], b[i]["prompt"]); // the tasks do not change
        ASSERT_EQ(a[i]["metadata"]["reference_turns"].size(), 2u);
        const json &ref = b[i]["metadata"]["reference_turns"];
        if (ref.size() == 2) {
            EXPECT_EQ(ref, a[i]["metadata"]["reference_turns"]);
            continue;
        }
        ASSERT_EQ(ref.size(), 1u);
        ++direct;
        const std::string expr = b[i]["metadata"]["expr"].get<std::string>(); // "47 * 23"
        const int64_t x = std::stoll(expr.substr(0, expr.find(' ')));
        const int64_t y = std::stoll(expr.substr(expr.rfind(' ') + 1));
        const auto lead = [](int64_t v) { return (v + 5) / 10 * 10; }; // 2-digit operands
        EXPECT_EQ(ref[0], std::to_string(lead(x) * lead(y))) << expr;
        // A direct answer is one turn: the env takes it as the final answer.
        const json r = step_of(*half, b[i], nullptr, ref[0].get<std::string>());
        EXPECT_EQ(r["done"], true);
    }
    EXPECT_GT(direct, 70);
    EXPECT_LT(direct, 130);
    // Out of range is refused, naming the parameter.
    const Outputs bad = create_status("calculator", {{"reference_tool_rate", 1.5}});
    EXPECT_FALSE(bad.ok());
    EXPECT_NE(bad.error.find("reference_tool_rate"), std::string::npos) << bad.error;
}

TEST(MultiTurnEnvs, SingleTurnEnvsHaveNoStep) {
    auto env = make("reverse_text");
    EXPECT_EQ(env->step("{}", "null", "x").status, RL_ERR_UNSUPPORTED);
}

// ---- command -----------------------------------------------------------------------------

json py(const std::string &script, double timeout_s = 5.0) {
    return {{"command", {"python3", verifier(script)}}, {"timeout_s", timeout_s}};
}
json sh(const std::string &script, double timeout_s = 5.0) {
    return {{"command", {"sh", verifier(script)}}, {"timeout_s", timeout_s}};
}
const json kTask = {{"prompt", "say golf"}, {"answer", "golf"}, {"metadata", json::object()}};

TEST(CommandEnv, ScoresThroughAWellBehavedVerifierAndKeepsItRunning) {
    auto env = make("command", py("exact_match.py"));
    Scored a = score(*env, kTask, " golf\n");
    ASSERT_TRUE(a.out.ok()) << a.out.error;
    EXPECT_EQ(a.reward, 1.0);
    EXPECT_EQ(a.out.metrics["completion_chars"], 6);
    EXPECT_GT(a.out.metrics["verifier_seconds"], 0.0);
    Scored b = score(*env, kTask, "tango");
    ASSERT_TRUE(b.out.ok()) << b.out.error;
    EXPECT_EQ(b.reward, 0.0);
    EXPECT_EQ(a.out.metrics["pid"], b.out.metrics["pid"]); // one process for both
}

TEST(CommandEnv, LargeCompletionsRoundTrip) {
    auto env = make("command", py("exact_match.py"));
    const std::string big(400 * 1024, 'x'); // several pipe buffers
    Scored s = score(*env, kTask, big);
    ASSERT_TRUE(s.out.ok()) << s.out.error;
    EXPECT_EQ(s.out.metrics["completion_chars"], static_cast<double>(big.size()));
}

TEST(CommandEnv, SamplesFromTheVerifierDeterministically) {
    auto env = make("command", py("exact_match.py"));
    const json a = tasks_of(*env, 4, 3);
    ASSERT_EQ(a.size(), 4u);
    EXPECT_EQ(a, tasks_of(*env, 4, 3));
    EXPECT_EQ(a[0]["prompt"], "say " + a[0]["answer"].get<std::string>());
    EXPECT_TRUE(a[0]["metadata"].is_object());
}

TEST(CommandEnv, SamplesFromATasksFileWhenGiven) {
    json p = py("exact_match.py");
    p["tasks"] = write_file("cmd_tasks.jsonl", kRows);
    auto env = make("command", p);
    const json a = tasks_of(*env, 3, 1);
    std::set<std::string> prompts;
    for (const json &t : a) prompts.insert(t["prompt"]);
    EXPECT_EQ(prompts.size(), 3u);
}

TEST(CommandEnv, VerifierInPosixShellWorks) {
    auto env = make("command", sh("half_reward.sh"));
    for (int i = 0; i < 3; ++i) {
        Scored s = score(*env, kTask, "anything \"quoted\"\n");
        ASSERT_TRUE(s.out.ok()) << s.out.error;
        EXPECT_EQ(s.reward, 0.5);
        EXPECT_EQ(s.out.metrics["from_sh"], 1.0);
    }
}

TEST(CommandEnv, HangingVerifierTimesOutAndItsWholeProcessGroupIsKilled) {
    const std::string pid_file = temp_dir() + "/hang.pids";
    std::remove(pid_file.c_str());
    json p = sh("hang.sh", 1.0);
    p["command"].push_back(pid_file);
    auto env = make("command", p);
    const auto t0 = Clock::now();
    Scored s = score(*env, kTask, "golf");
    const double took = std::chrono::duration<double>(Clock::now() - t0).count();
    EXPECT_EQ(s.out.status, RL_ERR_TIMEOUT) << s.out.error;
    EXPECT_NE(s.out.error.find("timeout_s = 1"), std::string::npos) << s.out.error;
    EXPECT_NE(s.out.error.find("hang.sh"), std::string::npos) << s.out.error;
    EXPECT_LT(took, 4.0);
    long shell = 0, sleeper = 0;
    std::ifstream(pid_file) >> shell >> sleeper;
    ASSERT_GT(shell, 0);
    ASSERT_GT(sleeper, 0);
    EXPECT_TRUE(dies_within(shell, std::chrono::milliseconds(2000)));
    EXPECT_TRUE(dies_within(sleeper, std::chrono::milliseconds(2000)));
    EXPECT_TRUE(my_children().empty());
}

TEST(CommandEnv, CrashingVerifierIsAnIoErrorAndIsRestarted) {
    auto env = make("command", sh("crash.sh"));
    for (int i = 0; i < 2; ++i) { // the second request runs a fresh verifier
        Scored s = score(*env, kTask, "golf");
        EXPECT_EQ(s.out.status, RL_ERR_IO);
        EXPECT_NE(s.out.error.find("exited with status 3"), std::string::npos) << s.out.error;
    }
    EXPECT_TRUE(my_children().empty());
}

TEST(CommandEnv, GarbageOutputIsAnIoError) {
    auto env = make("command", sh("garbage.sh"));
    Scored s = score(*env, kTask, "golf");
    EXPECT_EQ(s.out.status, RL_ERR_IO);
    EXPECT_NE(s.out.error.find("not JSON"), std::string::npos) << s.out.error;
    EXPECT_NE(s.out.error.find("<html>"), std::string::npos) << s.out.error;
}

TEST(CommandEnv, EachMisbehaviourFailsOnlyItsRequestAndTheNextOneWorks) {
    auto env = make("command", py("flaky.py", 2.0));
    double pid = score(*env, kTask, "ok").out.metrics["pid"];
    ASSERT_GT(pid, 0);
    const std::vector<std::pair<std::string, rl_status_t>> cases = {
        {"hang", RL_ERR_TIMEOUT}, {"crash", RL_ERR_IO},    {"segv", RL_ERR_IO},
        {"garbage", RL_ERR_IO},   {"wrong-id", RL_ERR_IO}, {"no-reward", RL_ERR_IO},
    };
    for (const auto &c : cases) {
        Scored bad = score(*env, kTask, c.first);
        EXPECT_EQ(bad.out.status, c.second) << c.first << ": " << bad.out.error;
        EXPECT_NE(bad.out.error.find("restarted"), std::string::npos) << bad.out.error;
        Scored good = score(*env, kTask, "ok");
        ASSERT_TRUE(good.out.ok()) << c.first << " then ok: " << good.out.error;
        EXPECT_EQ(good.reward, 1.0);
        EXPECT_NE(good.out.metrics["pid"], pid) << c.first << ": not restarted";
        pid = good.out.metrics["pid"];
    }
}

TEST(CommandEnv, ExtraOutputLineIsCaughtByTheRequestId) {
    auto env = make("command", py("flaky.py"));
    Scored first = score(*env, kTask, "two-lines");
    ASSERT_TRUE(first.out.ok()) << first.out.error;
    EXPECT_EQ(first.reward, 0.25);
    // The stray second line answers the wrong request id: refused, restarted.
    Scored second = score(*env, kTask, "ok");
    EXPECT_EQ(second.out.status, RL_ERR_IO);
    EXPECT_NE(second.out.error.find("\"id\""), std::string::npos) << second.out.error;
    EXPECT_EQ(score(*env, kTask, "ok").reward, 1.0);
}

TEST(CommandEnv, VerifierThatExitedBetweenRequestsIsRestartedBeforeTheNext) {
    auto env = make("command", py("flaky.py"));
    Scored a = score(*env, kTask, "answer-then-exit");
    ASSERT_TRUE(a.out.ok()) << a.out.error;
    EXPECT_EQ(a.reward, 0.5);
    std::this_thread::sleep_for(std::chrono::milliseconds(300)); // let it exit
    Scored b = score(*env, kTask, "ok");
    ASSERT_TRUE(b.out.ok()) << b.out.error;
    EXPECT_EQ(b.reward, 1.0);
}

TEST(CommandEnv, VerifierReportedErrorFailsTheRequestButKeepsTheProcess) {
    auto env = make("command", py("flaky.py"));
    const double pid = score(*env, kTask, "ok").out.metrics["pid"];
    Scored e = score(*env, kTask, "error");
    EXPECT_EQ(e.out.status, RL_ERR_UNKNOWN);
    EXPECT_NE(e.out.error.find("cannot judge this one"), std::string::npos) << e.out.error;
    EXPECT_EQ(score(*env, kTask, "ok").out.metrics["pid"], pid);
}

TEST(CommandEnv, ClosedStdinIsAnIoErrorAndNoSigpipeReachesTheHost) {
    // If SIGPIPE reached this process, the test binary would die here.
    ASSERT_EQ(std::signal(SIGPIPE, SIG_DFL), SIG_DFL);
    auto env = make("command", sh("no_stdin.sh"));
    const std::string big(1 << 20, 'y');
    for (int i = 0; i < 2; ++i) {
        Scored s = score(*env, kTask, big);
        EXPECT_EQ(s.out.status, RL_ERR_IO) << s.out.error;
    }
    sigset_t pending;
    sigemptyset(&pending);
    sigpending(&pending);
    EXPECT_EQ(sigismember(&pending, SIGPIPE), 0);
}

TEST(CommandEnv, AbortFlagEndsTheWaitEarly) {
    auto env = make("command", py("flaky.py", 30.0));
    volatile int32_t flag = 0;
    std::thread setter([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        flag = 1;
    });
    const auto t0 = Clock::now();
    Scored s = score(*env, kTask, "hang", &flag);
    setter.join();
    EXPECT_EQ(s.out.status, RL_ERR_ABORTED) << s.out.error;
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 5.0);
    EXPECT_TRUE(my_children().empty());
}

TEST(CommandEnv, NoDescriptorOrChildLeaksAcrossRestartsAndDestroy) {
    const size_t fds_before = open_fds();
    {
        auto env = make("command", py("flaky.py", 2.0));
        for (const char *c : {"ok", "crash", "ok", "garbage", "hang", "ok"}) score(*env, kTask, c);
        EXPECT_EQ(my_children().size(), 1u);   // the live verifier
        EXPECT_EQ(open_fds(), fds_before + 2); // its stdin and stdout pipes
    }
    EXPECT_EQ(open_fds(), fds_before);
    EXPECT_TRUE(my_children().empty());
}

TEST(CommandEnv, ExecFailureIsReportedWithTheReason) {
    const std::string path = write_file("bad_interp.sh", "#!/nonexistent/interpreter\n");
    ::chmod(path.c_str(), 0755);
    auto env = make("command", {{"command", {path}}});
    Scored s = score(*env, kTask, "golf");
    EXPECT_EQ(s.out.status, RL_ERR_IO);
    EXPECT_NE(s.out.error.find("cannot execute"), std::string::npos) << s.out.error;
    EXPECT_TRUE(my_children().empty());
}

TEST(CommandEnv, BadParametersAreRefused) {
    Outputs o = create_status("command", json::object());
    EXPECT_EQ(o.status, RL_ERR_INVALID_ARG);
    EXPECT_NE(o.error.find("'command'"), std::string::npos) << o.error;
    o = create_status("command", {{"command", "python3 verify.py"}});
    EXPECT_NE(o.error.find("array"), std::string::npos) << o.error;
    o = create_status("command", {{"command", {"no-such-program-xyz"}}});
    EXPECT_EQ(o.status, RL_ERR_NOT_FOUND);
    EXPECT_NE(o.error.find("no-such-program-xyz"), std::string::npos) << o.error;
    o = create_status("command", {{"command", {"sh"}}, {"cwd", "/no/such/dir"}});
    EXPECT_EQ(o.status, RL_ERR_NOT_FOUND);
    o = create_status("command", {{"command", {"sh"}}, {"timeout_s", 0}});
    EXPECT_NE(o.error.find("timeout_s"), std::string::npos) << o.error;
    o = create_status("command", {{"command", {"sh"}}, {"env", {{"A", 1}}}});
    EXPECT_NE(o.error.find("'env'"), std::string::npos) << o.error;
}

TEST(CommandEnv, EnvAndCwdReachTheVerifier) {
    const std::string script =
        write_file("envcheck.sh",
                   "while IFS= read -r line; do\n"
                   "  id=$(printf '%s\\n' \"$line\" | sed -n 's/^{\"id\":\\([0-9]*\\).*/\\1/p')\n"
                   "  if [ \"$MY_FLAG\" = on ] && [ -f here.txt ]; then r=1; else r=0; fi\n"
                   "  printf '{\"id\": %s, \"reward\": %s}\\n' \"$id\" \"$r\"\n"
                   "done\n");
    write_file("here.txt", "x");
    auto env =
        make("command",
             {{"command", {"sh", script}}, {"env", {{"MY_FLAG", "on"}}}, {"cwd", temp_dir()}});
    Scored s = score(*env, kTask, "golf");
    ASSERT_TRUE(s.out.ok()) << s.out.error;
    EXPECT_EQ(s.reward, 1.0);
}

} // namespace
