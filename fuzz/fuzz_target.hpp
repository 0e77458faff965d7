// fuzz/fuzz_target.hpp: what every fuzz target shares. A target defines
// LLVMFuzzerTestOneInput, which libFuzzer calls (the clang build,
// fuzz/CMakeLists.txt) and replay_main.cpp calls too (the replay tests of the
// main build). The documented refusals of the code under test (rl::core::Error,
// the serve ApiError, the host's HostError) are the expected end of a bad
// input; anything else escaping, a crash or a hang is a finding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

/// The input as text.
inline std::string fuzz_text(const uint8_t *data, size_t size) {
    return std::string(reinterpret_cast<const char *>(data), size);
}
