// Writes tests/losses/loss_fixtures.h: fixed inputs for every loss and the
// outputs the C++ path (the plugin classes through the SDK test host) gives for
// them. loss_fixture_test checks the C++ path still gives them and that they
// agree with the direct formulas; loss_c_abi_test checks the C ABI (librl +
// the built .so files) gives them too.
//
//   cmake --build <build> --target loss_fixture_gen
//   <build>/bin/loss_fixture_gen > tests/losses/loss_fixtures.h
#include "loss_cases.hpp"

#include <cstdio>
#include <string>
#include <vector>

namespace {

using namespace rl::losses::test;

struct FixtureCase {
    std::string loss;
    std::string params;
    uint64_t seed;
    double global_tokens = 0, global_seqs = 0;
    std::vector<double> seq_ratio_targets = {};
};

const std::vector<FixtureCase> &fixture_cases() {
    static const std::vector<FixtureCase> c = {
        {"causallm_loss", "{}", 101},
        {"per_token_ce", R"({"loss_agg_mode":"sum"})", 102},
        {"policy_loss",
         R"({"eps_clip":0.2,"eps_clip_high":0.28,"eps_clip_c":3,"icepop_beta":5,"use_tis":true,)"
         R"("compute_kl_stats":true,"kl_coef":0.1,"kl_type":"k3","entropy_coef":0.01})",
         103},
        {"policy_loss", R"({"loss_agg_mode":"seq-mean-token-sum-norm","max_seq_len":8})", 104, 0,
         9},
        {"importance_sampling",
         R"({"compute_kl_stats":true,"loss_agg_mode":"seq-mean-token-mean"})", 105},
        {"grpo",
         R"({"teacher_tau":0.5,"kl_tau":0.1,"geo_mask_low":0.3,"geo_mask_high":3,)"
         R"("sequence_mask_high":20})",
         106},
        {"grpo", R"({"ratio_type":"sequence","sequence_clip_high":2,"kl_coef":0.05})", 107, 30, 0},
        {"decoupled_ppo", R"({"c_clip":3,"behav_imp_weight_cap":2,"eps_clip_higher":0.28})", 108},
        {"cispo", R"({"clip_high":2,"loss_agg_mode":"sum","compute_kl_stats":true})", 109},
        {"gspo", R"({"eps_clip":0.2,"eps_clip_high":0.28})", 110, 0, 0, {0.6, 1.05, 1.5}},
        {"value_loss", R"({"vf_clip":0.2,"loss_agg_mode":"seq-mean-token-sum"})", 111},
        {"sapo", R"({"tau_pos":1,"tau_neg":1.05,"kl_coef":0.1,"kl_type":"k3+"})", 112},
        {"gmpo", R"({"eps_clip":0.4,"eps_clip_high":0.4})", 113},
        {"clip_cov", R"({"clip_cov_ratio":0.2,"clip_cov_lb":0.05,"clip_cov_ub":1.5,"seed":3})",
         114},
        {"kl_cov", R"({"kl_cov_ratio":0.2,"ppo_kl_coef":0.5,"kl_coef":0.1,"kl_type":"abs"})", 115},
        {"value_loss", R"({"huber_delta":0.5,"vf_coef":0.5})", 116},
    };
    return c;
}

std::string c_string(const std::string &s) {
    std::string out = "\"";
    for (char ch : s) {
        if (ch == '"' || ch == '\\') out += '\\';
        out += ch;
    }
    return out + "\"";
}

void print_array(const std::string &name, const std::vector<double> &xs) {
    std::printf("static const double %s[] = {", name.c_str());
    for (size_t i = 0; i < xs.size(); ++i) std::printf("%s%.17g", i ? ", " : "", xs[i]);
    std::printf("};\n");
}

void print_int_array(const std::string &name, const std::vector<int64_t> &xs) {
    std::printf("static const int64_t %s[] = {", name.c_str());
    for (size_t i = 0; i < xs.size(); ++i)
        std::printf("%s%lld", i ? ", " : "", static_cast<long long>(xs[i]));
    std::printf("};\n");
}

// Prints the arrays of case k and sets `row` to its lf_case initializer.
template <class L>
int emit_case(size_t k, const FixtureCase &fc, std::string &row) {
    T::Host host;
    T::Instance<L> inst(host, fc.params);
    if (!inst.ok()) {
        std::fprintf(stderr, "case %zu (%s): %s\n", k, fc.loss.c_str(), inst.error().c_str());
        return 1;
    }
    GenOptions opt;
    opt.lens = {4, 1, 5, 3, 6};
    opt.seq_ratio_targets = fc.seq_ratio_targets;
    Batch b =
        (fc.loss == "decoupled_ppo" ? decoupled_batch(fc.seed, opt) : random_batch(fc.seed, opt))
            .only(accepted_inputs(inst));
    b.global_tokens = fc.global_tokens;
    b.global_seqs = fc.global_seqs;
    const T::LossRun run = T::run_loss(inst, b.inputs());
    if (run.status != RL_OK) {
        std::fprintf(stderr, "case %zu (%s): %s\n", k, fc.loss.c_str(), run.error.c_str());
        return 1;
    }
    const std::string p = "lf_c" + std::to_string(k) + "_";
    print_int_array(p + "cu", b.cu);
    std::vector<std::string> in_rows, grad_rows, out_rows;
    for (const auto &kv : b.f) {
        print_array(p + kv.first, kv.second);
        in_rows.push_back("{\"" + kv.first + "\", 0, " + p + kv.first + ", NULL}");
    }
    if (b.has_labels) {
        print_int_array(p + "labels", b.labels);
        in_rows.push_back("{\"labels\", 1, NULL, " + p + "labels}");
    }
    for (const auto &kv : run.grads) {
        print_array(p + "grad_" + kv.first, kv.second);
        grad_rows.push_back("{\"" + kv.first + "\", 0, " + p + "grad_" + kv.first + ", NULL}");
    }
    for (const auto &kv : run.tensors) {
        print_array(p + "out_" + kv.first, kv.second);
        out_rows.push_back("{\"" + kv.first + "\", 0, " + p + "out_" + kv.first + ", NULL}");
    }
    auto rows = [&](const char *type, const std::string &name, const std::vector<std::string> &r) {
        if (r.empty()) return;
        std::printf("static const %s %s[] = {\n", type, name.c_str());
        for (const auto &row : r) std::printf("    %s,\n", row.c_str());
        std::printf("};\n");
    };
    rows("lf_tensor", p + "inputs", in_rows);
    rows("lf_tensor", p + "grads", grad_rows);
    rows("lf_tensor", p + "outputs", out_rows);
    std::printf("static const lf_value %smetrics[] = {\n", p.c_str());
    for (const auto &kv : run.metrics)
        std::printf("    {\"%s\", %.17g},\n", kv.first.c_str(), kv.second);
    std::printf("};\n\n");
    char buf[2048];
    std::snprintf(
        buf, sizeof(buf),
        "    {\"%s\", %s, %lld, %lld, %scu, %.17g, %.17g, %d, %sinputs, %.17g, %d, %s, %d, "
        "%s, %d, %smetrics}",
        fc.loss.c_str(), c_string(fc.params).c_str(), static_cast<long long>(b.n()),
        static_cast<long long>(b.cu.size()), p.c_str(), fc.global_tokens, fc.global_seqs,
        int(in_rows.size()), p.c_str(), run.loss, int(grad_rows.size()),
        grad_rows.empty() ? "NULL" : (p + "grads").c_str(), int(out_rows.size()),
        out_rows.empty() ? "NULL" : (p + "outputs").c_str(), int(run.metrics.size()), p.c_str());
    row = buf;
    return 0;
}

} // namespace

int main() {
    std::printf(
        "/* tests/losses/loss_fixtures.h: GENERATED by loss_fixture_gen.cpp from the C++ path\n"
        " * (plugin classes through rl/sdk/testing.hpp). Do not edit; regenerate with\n"
        " *   cmake --build <build> --target loss_fixture_gen\n"
        " *   <build>/bin/loss_fixture_gen > tests/losses/loss_fixtures.h\n"
        " * Plain C11, shared by loss_fixture_test.cpp and loss_c_abi_test.c. */\n"
        "#ifndef RL_TESTS_LOSS_FIXTURES_H\n#define RL_TESTS_LOSS_FIXTURES_H\n\n/* clang-format off "
        "*/\n"
        "#include <stddef.h>\n#include <stdint.h>\n\n"
        "typedef struct lf_tensor {\n"
        "    const char *name;\n"
        "    int is_int;       /* 1: int64 data in i, else float64 data in f */\n"
        "    const double *f;\n"
        "    const int64_t *i;\n"
        "} lf_tensor;\n\n"
        "typedef struct lf_value {\n"
        "    const char *name;\n"
        "    double value;\n"
        "} lf_value;\n\n"
        "typedef struct lf_case {\n"
        "    const char *name;   /* loss plugin name */\n"
        "    const char *params; /* JSON */\n"
        "    int64_t n_tokens;\n"
        "    int64_t n_cu;       /* n_seqs + 1 */\n"
        "    const int64_t *cu_seqlens;\n"
        "    double global_tokens, global_seqs;\n"
        "    int n_inputs;\n"
        "    const lf_tensor *inputs;\n"
        "    double loss;\n"
        "    int n_grads;        /* d loss / d input, by input name */\n"
        "    const lf_tensor *grads;\n"
        "    int n_outputs;      /* extra per-token tensors the loss emits */\n"
        "    const lf_tensor *outputs;\n"
        "    int n_metrics;\n"
        "    const lf_value *metrics;\n"
        "} lf_case;\n\n");
    const auto &cs = fixture_cases();
    std::vector<std::string> case_rows;
    for (size_t k = 0; k < cs.size(); ++k) {
        const FixtureCase &fc = cs[k];
        int rc = 0;
        std::string row;
        with_loss(fc.loss,
                  [&](auto tag) { rc = emit_case<typename decltype(tag)::type>(k, fc, row); });
        if (rc) return rc;
        case_rows.push_back(row);
    }
    std::printf("static const lf_case lf_cases[] = {\n");
    for (const auto &r : case_rows) std::printf("%s,\n", r.c_str());
    std::printf("};\n#define LF_N_CASES %zu\n\n/* clang-format on */\n#endif /* "
                "RL_TESTS_LOSS_FIXTURES_H */\n",
                cs.size());
    return 0;
}
