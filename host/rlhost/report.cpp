#include "report.hpp"

#include "rl/core/json.hpp"
#include "rl/core/text.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

namespace rlhost {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct Failure {
    std::string message;
};

// The JSON records of a .jsonl file, one per line. A last line without its
// newline is a record being written by a run that is still going: skipped.
// Any other line that is not a JSON object is an error naming file and line.
std::vector<json> read_jsonl(const fs::path &path, bool required) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        if (required) throw Failure{"cannot read " + path.string()};
        return {};
    }
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    std::vector<json> out;
    size_t start = 0, line = 0;
    while (start < text.size()) {
        const size_t end = text.find('\n', start);
        ++line;
        if (end == std::string::npos) break; // being written
        const std::string_view s(text.data() + start, end - start);
        start = end + 1;
        if (s.find_first_not_of(" \t\r") == std::string_view::npos) continue;
        json j;
        std::string why;
        if (!rl::core::try_parse_json(s, j, path.string() + ":" + std::to_string(line), &why) ||
            !j.is_object())
            throw Failure{path.string() + ":" + std::to_string(line) + " is not a JSON object" +
                          (why.empty() ? "" : ": " + why)};
        out.push_back(std::move(j));
    }
    return out;
}

std::string number(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.4g", v);
    return buf;
}

// A metric of one phase: (step, value) pairs in step order.
using Series = std::vector<std::pair<double, double>>;

// Metrics shown first, in this order; the rest alphabetically.
int rank_of(const std::string &key) {
    static const std::vector<std::string> first = {
        "reward", "eval/reward_mean", "eval/pass_at_k", "exact",  "kl",           "ref_kl",
        "loss",   "entropy",          "grad_norm",      "tokens", "tokens_per_s", "step_time"};
    const auto it = std::find(first.begin(), first.end(), key);
    return it == first.end() ? static_cast<int>(first.size())
                             : static_cast<int>(it - first.begin());
}

// One line chart as inline SVG: the series, its range and the first / last
// values.
std::string chart(const std::string &title, const Series &s) {
    constexpr double W = 320, H = 160, L = 46, R = 8, T = 22, B = 22;
    double x0 = s.front().first, x1 = s.back().first;
    double y0 = s.front().second, y1 = y0;
    for (const auto &[x, y] : s) {
        y0 = std::min(y0, y);
        y1 = std::max(y1, y);
    }
    if (x1 == x0) x1 = x0 + 1;
    if (y1 == y0) {
        y0 -= 0.5;
        y1 += 0.5;
    }
    auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
    auto py = [&](double y) { return T + (y1 - y) / (y1 - y0) * (H - T - B); };
    std::ostringstream o;
    o << "<figure class=\"chart\"><svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W
      << "\" height=\"" << H << "\" viewBox=\"0 0 " << W << " " << H << "\" role=\"img\">"
      << "<title>" << rl::core::html_escape(title) << "</title>"
      << "<text x=\"" << L << "\" y=\"14\" class=\"t\">" << rl::core::html_escape(title)
      << "</text>"
      << "<rect x=\"" << L << "\" y=\"" << T << "\" width=\"" << W - L - R << "\" height=\""
      << H - T - B << "\" class=\"frame\"/>"
      << "<text x=\"" << L - 4 << "\" y=\"" << T + 8 << "\" class=\"yl\">" << number(y1)
      << "</text><text x=\"" << L - 4 << "\" y=\"" << H - B << "\" class=\"yl\">" << number(y0)
      << "</text><text x=\"" << L << "\" y=\"" << H - 6 << "\" class=\"xl\">" << number(x0)
      << "</text><text x=\"" << W - R << "\" y=\"" << H - 6 << "\" class=\"xr\">" << number(x1)
      << "</text><polyline class=\"line\" points=\"";
    for (size_t i = 0; i < s.size(); ++i)
        o << (i ? " " : "") << number(px(s[i].first)) << "," << number(py(s[i].second));
    o << "\"/></svg><figcaption>" << s.size() << " steps; last " << number(s.back().second)
      << "</figcaption></figure>\n";
    return o.str();
}

// The numbers of a record as flat keys (nested objects joined with "/").
void numbers_of(const json &j, const std::string &prefix, std::map<std::string, double> &out) {
    for (const auto &[k, v] : j.items()) {
        const std::string key = prefix.empty() ? k : prefix + "/" + k;
        if (v.is_number() && !v.is_boolean()) {
            const double d = v.get<double>();
            if (std::isfinite(d)) out[key] = d;
        } else if (v.is_object()) {
            numbers_of(v, key, out);
        }
    }
}

std::string cell(const json &v) {
    if (v.is_string()) return rl::core::html_escape(v.get<std::string>());
    if (v.is_number()) return number(v.get<double>());
    if (v.is_null()) return "";
    return rl::core::html_escape(v.dump());
}

std::string render(const fs::path &dir) {
    const std::vector<json> metrics = read_jsonl(dir / "metrics.jsonl", true);
    const std::vector<json> samples = read_jsonl(dir / "samples.jsonl", false);
    std::string name = dir.filename().string();
    // phase -> metric -> series; phases in order of first appearance.
    std::vector<std::string> phases;
    std::map<std::string, std::map<std::string, Series>> series;
    for (const auto &rec : metrics) {
        if (!rec.contains("phase") || !rec["phase"].is_string() || !rec.contains("step") ||
            !rec["step"].is_number())
            continue;
        const std::string phase = rec["phase"].get<std::string>();
        if (std::find(phases.begin(), phases.end(), phase) == phases.end()) phases.push_back(phase);
        const double step = rec["step"].get<double>();
        std::map<std::string, double> values;
        numbers_of(rec, "", values);
        values.erase("step");
        for (const auto &[k, v] : values) series[phase][k].emplace_back(step, v);
    }
    std::ostringstream o;
    o << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>run "
      << rl::core::html_escape(name) << "</title><style>"
      << "body{font:14px system-ui,sans-serif;margin:24px;color:#222}"
      << "h1{font-size:20px}h2{font-size:16px;margin-top:28px}"
      << ".charts{display:flex;flex-wrap:wrap;gap:12px}"
      << "figure{margin:0}figcaption{font-size:11px;color:#666}"
      << "svg .frame{fill:none;stroke:#ccc}svg .line{fill:none;stroke:#1f6fb2;stroke-width:1.5}"
      << "svg text{font-size:10px;fill:#444}svg .t{font-size:12px;font-weight:600}"
      << "svg .yl{text-anchor:end}svg .xr{text-anchor:end}"
      << "table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ddd;"
      << "padding:3px 6px;vertical-align:top;text-align:left}td pre{margin:0;white-space:pre-wrap;"
      << "max-width:480px}</style></head><body>\n"
      << "<h1>Run " << rl::core::html_escape(name) << "</h1>\n<p>" << metrics.size()
      << " step records from " << rl::core::html_escape((dir / "metrics.jsonl").string())
      << "</p>\n";
    for (const auto &phase : phases) {
        std::vector<std::string> keys;
        for (const auto &[k, s] : series[phase]) keys.push_back(k);
        std::stable_sort(keys.begin(), keys.end(), [](const std::string &a, const std::string &b) {
            const int ra = rank_of(a), rb = rank_of(b);
            return ra != rb ? ra < rb : a < b;
        });
        o << "<h2>Phase " << rl::core::html_escape(phase) << "</h2>\n<div class=\"charts\">\n";
        for (const auto &k : keys) o << chart(k, series[phase][k]);
        o << "</div>\n";
    }
    if (!samples.empty()) {
        // The newest steps first, at most 8 rows per step and 5 steps.
        std::map<double, std::vector<const json *>, std::greater<>> by_step;
        for (const auto &s : samples)
            if (s.contains("step") && s["step"].is_number())
                by_step[s["step"].get<double>()].push_back(&s);
        o << "<h2>Sampled rollouts</h2>\n<table><tr><th>step</th><th>group</th><th>prompt</th>"
          << "<th>completion</th><th>reward</th><th>advantage</th></tr>\n";
        int steps = 0;
        for (const auto &[step, rows] : by_step) {
            if (++steps > 5) break;
            for (size_t i = 0; i < rows.size() && i < 8; ++i) {
                const json &r = *rows[i];
                const json task = r.value("task", json());
                const json prompt = task.is_object() ? task.value("prompt", json()) : task;
                o << "<tr><td>" << number(step) << "</td><td>" << cell(r.value("group", json()))
                  << "</td><td><pre>" << cell(prompt) << "</pre></td><td><pre>"
                  << cell(r.value("completion", json())) << "</pre></td><td>"
                  << cell(r.value("reward", json())) << "</td><td>"
                  << cell(r.value("advantage", json())) << "</td></tr>\n";
            }
        }
        o << "</table>\n";
    }
    o << "</body></html>\n";
    return o.str();
}

} // namespace

int cmd_report(const std::vector<std::string> &args) {
    const char *usage = "usage: rlhost report RUN_DIR [--out FILE]  (default RUN_DIR/report.html)";
    std::string dir, out;
    for (size_t i = 0; i < args.size(); ++i) {
        const std::string &a = args[i];
        if (a == "--help" || a == "-h") {
            std::cout << usage << "\n";
            return 0;
        }
        if (a == "--out") {
            if (i + 1 >= args.size()) {
                std::cerr << "rlhost report: --out needs a value\n" << usage << "\n";
                return 1;
            }
            out = args[++i];
        } else if (a.rfind("--", 0) == 0 || !dir.empty()) {
            std::cerr << "rlhost report: unexpected argument '" << a << "'\n" << usage << "\n";
            return 1;
        } else {
            dir = a;
        }
    }
    if (dir.empty()) {
        std::cerr << "rlhost report: RUN_DIR is required\n" << usage << "\n";
        return 1;
    }
    if (out.empty()) out = (fs::path(dir) / "report.html").string();
    try {
        const std::string html = render(fs::path(dir));
        const std::string tmp = out + ".tmp";
        {
            std::ofstream f(tmp, std::ios::binary);
            if (!f) throw Failure{"cannot write " + tmp};
            f << html;
            if (!f.flush()) throw Failure{"cannot write " + tmp};
        }
        std::error_code ec;
        fs::rename(tmp, out, ec);
        if (ec) throw Failure{"cannot write " + out + ": " + ec.message()};
    } catch (const Failure &f) {
        std::cerr << "rlhost report: " << f.message << "\n";
        return 1;
    }
    std::cout << "rlhost report: wrote " << out << "\n";
    return 0;
}

} // namespace rlhost
