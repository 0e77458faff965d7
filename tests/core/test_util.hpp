// Helpers shared by the model-core tests.
#pragma once

#include "rl/core/error.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace rl::core::test {

/// A fresh folder under the system temp dir, removed with its contents.
class TempDir {
public:
    TempDir() {
        std::string templ =
            (std::filesystem::temp_directory_path() / "rl-core-test-XXXXXX").string();
        char *p = ::mkdtemp(templ.data());
        if (p == nullptr) throw std::runtime_error("mkdtemp failed");
        path_ = p;
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);
    }
    TempDir(const TempDir &) = delete;
    TempDir &operator=(const TempDir &) = delete;
    const std::string &path() const { return path_; }
    std::string operator/(const std::string &name) const { return path_ + "/" + name; }

private:
    std::string path_;
};

inline std::string slurp(const std::string &path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

inline void spit(const std::string &path, const std::string &bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << bytes;
}

inline std::string source_path(const std::string &rel) {
    return std::string(RL_TEST_SOURCE_DIR) + "/" + rel;
}

/// Runs `f`, expects rl::core::Error, and returns its message.
template <typename F>
std::string error_of(F &&f) {
    try {
        f();
    } catch (const rl::core::Error &e) {
        return e.what();
    } catch (const std::exception &e) {
        ADD_FAILURE() << "expected rl::core::Error, got another exception: " << e.what();
        return e.what();
    }
    ADD_FAILURE() << "expected rl::core::Error, nothing was thrown";
    return {};
}

} // namespace rl::core::test
