// One member of vLLM's StatelessProcessGroup rendezvous, driven by
// test_vllm_transfer.py against Python code that does what vLLM's side does.
//
//   vllm_peer trainer ADDRESS PORT WORLD_SIZE ID_HEX...
//       rank 0: hosts the store, publishes each id (broadcast_obj), then waits
//       for the key "test/done" before it exits (so the store outlives reads)
//   vllm_peer worker ADDRESS PORT RANK WORLD_SIZE COUNT
//       rank RANK: joins and reads COUNT ids from rank 0, printing each in hex
//
// Exits 1 with the error on stderr when the rendezvous or a value is refused.
#include "serve/vllm_transfer.hpp"

#include <chrono>
#include <cstdio>
#include <exception>
#include <string>

namespace {

std::string hex(const rl::serve::vllm::UniqueId &id) {
    static const char *digits = "0123456789abcdef";
    std::string s;
    for (uint8_t b : id) {
        s += digits[b >> 4];
        s += digits[b & 15];
    }
    return s;
}

rl::serve::vllm::UniqueId from_hex(const std::string &s) {
    rl::serve::vllm::UniqueId id{};
    if (s.size() != 2 * id.size()) throw std::runtime_error("an id is 256 hex digits: " + s);
    for (size_t i = 0; i < id.size(); ++i)
        id[i] = static_cast<uint8_t>(std::stoi(s.substr(2 * i, 2), nullptr, 16));
    return id;
}

int usage() {
    std::fprintf(stderr, "usage: vllm_peer trainer ADDRESS PORT WORLD_SIZE ID_HEX...\n"
                         "       vllm_peer worker ADDRESS PORT RANK WORLD_SIZE COUNT\n");
    return 2;
}

} // namespace

int main(int argc, char **argv) {
    using namespace rl::serve::vllm;
    if (argc < 2) return usage();
    const std::string role = argv[1];
    const auto timeout = std::chrono::seconds(60);
    try {
        if (role == "trainer" && argc >= 6) {
            StatelessGroup group(argv[2], std::stoi(argv[3]), 0, std::stoi(argv[4]), timeout);
            for (int i = 5; i < argc; ++i) group.broadcast_unique_id(from_hex(argv[i]));
            std::printf("published %d\n", argc - 5);
            std::fflush(stdout);
            (void)group.get("test/done");
            return 0;
        }
        if (role == "worker" && argc == 7) {
            StatelessGroup group(argv[2], std::stoi(argv[3]), std::stoi(argv[4]),
                                 std::stoi(argv[5]), timeout);
            const int count = std::stoi(argv[6]);
            for (int i = 0; i < count; ++i)
                std::printf("%s\n", hex(group.broadcast_unique_id(std::nullopt)).c_str());
            return 0;
        }
    } catch (const std::exception &e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
    return usage();
}
