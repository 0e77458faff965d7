// tests/plugin_host/runtime_fixture.hpp: a librl runtime (rl_runtime target)
// that loads only the named plugin libraries of the build, for integration
// tests of plugins through the embedder API (abi/rl/runtime.h).
#pragma once

#include <rl_api.h>

#include <gtest/gtest.h>

#include <string>
#include <vector>

// The last C API call's error message names `needle` (else it is printed whole).
#define RL_EXPECT_ERROR_HAS(needle)                                                                \
    EXPECT_NE(std::string(rl_last_error()).find(needle), std::string::npos) << rl_last_error()

namespace rltest {

class RuntimeFixture {
public:
    // targets: plugin targets without the "rl-" prefix ("filter-gibberish").
    explicit RuntimeFixture(const std::vector<std::string> &targets) {
        for (const auto &t : targets)
            path_ +=
                (path_.empty() ? "" : ":") + std::string(RL_TEST_PLUGIN_DIR) + "/rl-" + t + ".so";
        rl_runtime_desc_t d = RL_RUNTIME_DESC_INIT;
        d.flags = RL_RUNTIME_NO_DEFAULT_PLUGINS;
        d.plugin_path = path_.c_str();
        d.log_level = "off";
        status_ = rl_runtime_create(&d, &rt_);
    }
    ~RuntimeFixture() { rl_runtime_destroy(rt_); }
    RuntimeFixture(const RuntimeFixture &) = delete;
    RuntimeFixture &operator=(const RuntimeFixture &) = delete;

    rl_runtime_t *get() const { return rt_; }
    rl_status_t status() const { return status_; }

private:
    std::string path_;
    rl_runtime_t *rt_ = nullptr;
    rl_status_t status_ = RL_OK;
};

// Owns an rl_result_t.
struct Result {
    rl_result_t *r = nullptr;
    ~Result() { rl_result_destroy(r); }
    double scalar(const char *name) const {
        double x = -1;
        EXPECT_EQ(rl_result_scalar(r, name, &x), RL_OK) << name << ": " << rl_last_error();
        return x;
    }
    double metric(const char *name) const {
        double x = -1;
        EXPECT_EQ(rl_result_metric(r, name, &x), RL_OK) << name << ": " << rl_last_error();
        return x;
    }
    std::string text(const char *name) const {
        rl_string_view_t s{nullptr, 0};
        EXPECT_EQ(rl_result_text(r, name, &s), RL_OK) << name << ": " << rl_last_error();
        return std::string(s.data ? s.data : "", static_cast<size_t>(s.length));
    }
};

} // namespace rltest
