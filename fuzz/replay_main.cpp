// fuzz/replay_main.cpp: runs saved inputs through a fuzz target's
// LLVMFuzzerTestOneInput without libFuzzer (the replay tests of the main
// build: the seed corpus and every regression input, so an input that once
// crashed fails `make test` again if it crashes again).
//
//   replay_<target> PATH...    every file given, and every file under each
//                              folder given (recursively, in name order)
//
// Files named *.pending are skipped (and counted): regression inputs whose
// fix has not landed yet. Exits 1 when no input was found.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

namespace fs = std::filesystem;

int main(int argc, char **argv) {
    std::vector<fs::path> files;
    for (int i = 1; i < argc; ++i) {
        const fs::path p = argv[i];
        if (fs::is_directory(p)) {
            std::vector<fs::path> under;
            for (const auto &e : fs::recursive_directory_iterator(p))
                if (e.is_regular_file()) under.push_back(e.path());
            std::sort(under.begin(), under.end());
            files.insert(files.end(), under.begin(), under.end());
        } else if (fs::is_regular_file(p)) {
            files.push_back(p);
        } else {
            std::fprintf(stderr, "replay: '%s' is neither a file nor a folder\n", argv[i]);
            return 1;
        }
    }
    size_t ran = 0, pending = 0;
    for (const auto &f : files) {
        if (f.extension() == ".pending") {
            ++pending;
            continue;
        }
        std::ifstream in(f, std::ios::binary);
        if (!in) {
            std::fprintf(stderr, "replay: cannot read '%s'\n", f.c_str());
            return 1;
        }
        const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                      std::istreambuf_iterator<char>());
        // What a crash report should name: printed before the run.
        std::fprintf(stderr, "replay: %s (%zu bytes)\n", f.c_str(), bytes.size());
        // A copy of exactly the input's size, as libFuzzer hands it over.
        std::vector<uint8_t> data(bytes.begin(), bytes.end());
        static const uint8_t empty = 0;
        LLVMFuzzerTestOneInput(data.empty() ? &empty : data.data(), data.size());
        ++ran;
    }
    std::printf("replayed %zu inputs (%zu pending skipped)\n", ran, pending);
    if (ran == 0) {
        std::fprintf(stderr, "replay: no inputs found\n");
        return 1;
    }
    return 0;
}
