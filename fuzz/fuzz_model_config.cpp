// Fuzz target: config.json text (ModelConfig::parse), then the config.json
// it would save (to_json).
#include "fuzz_target.hpp"

#include "rl/core/config.hpp"
#include "rl/core/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    try {
        const rl::core::ModelConfig c =
            rl::core::ModelConfig::parse(fuzz_text(data, size), "fuzz config.json");
        (void)c.to_json();
        (void)c.to_json("bfloat16");
        (void)c.num_key_value_groups();
        (void)c.q_size();
        (void)c.kv_size();
    } catch (const rl::core::Error &) {
    }
    return 0;
}
