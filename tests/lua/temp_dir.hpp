// temp_dir(prefix): a fresh folder /tmp/<prefix>XXXXXX for one test, removed
// at exit unless a test failed (then they stay for a look).
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <unistd.h>
#include <vector>

namespace rl_test {

inline std::vector<std::string> &temp_dirs() {
    static std::vector<std::string> dirs;
    return dirs;
}

inline void remove_temp_dirs() {
    if (::testing::UnitTest::GetInstance()->failed_test_count() > 0) return;
    for (const auto &d : temp_dirs()) {
        std::error_code ec;
        std::filesystem::remove_all(d, ec);
    }
}

inline std::string temp_dir(const std::string &prefix) {
    static const bool registered = (temp_dirs(), std::atexit(remove_temp_dirs) == 0);
    (void)registered;
    std::string tmpl = "/tmp/" + prefix + "XXXXXX";
    const char *d = mkdtemp(tmpl.data());
    EXPECT_NE(d, nullptr);
    if (!d) return "/tmp";
    temp_dirs().push_back(d);
    return d;
}

} // namespace rl_test
