// Fuzz target: a run configuration YAML file as `rlhost run` reads it
// (rl::host::load_config: YAML, checked against the schema, defaults filled).
// load_config reads a path, so the input goes to a memory file read through
// /proc/self/fd. Lines of the input starting "#set " (YAML comments, so the
// file reads the same) are also handed over as --set overrides ("a.b=value").
#include "fuzz_target.hpp"

#include "rl/host/config.hpp"
#include "rl/host/runtime.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace {

// One memory file for the whole run, rewritten for each input.
const std::string &memory_file(const uint8_t *data, size_t size) {
    static const int fd = memfd_create("fuzz_yaml_config", 0);
    static const std::string path = "/proc/self/fd/" + std::to_string(fd);
    if (fd < 0 || ftruncate(fd, 0) != 0) {
        std::perror("fuzz_yaml_config: memory file");
        std::abort();
    }
    size_t done = 0;
    while (done < size) {
        const ssize_t n = pwrite(fd, data + done, size - done, static_cast<off_t>(done));
        if (n <= 0) {
            std::perror("fuzz_yaml_config: write");
            std::abort();
        }
        done += static_cast<size_t>(n);
    }
    return path;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const std::string &path = memory_file(data, size);
    std::vector<std::string> overrides;
    std::istringstream lines(fuzz_text(data, size));
    for (std::string line; std::getline(lines, line);)
        if (line.rfind("#set ", 0) == 0) overrides.push_back(line.substr(5));
    try {
        const rl::host::LoadedConfig c = rl::host::load_config(path, overrides);
        (void)c.config.dump();
    } catch (const rl::host::HostError &) {
    }
    return 0;
}
