// fuzz/tinker_request.hpp: what the training server does next with a parsed
// forward_backward request, for the two Tinker wire targets: reads every
// token and tensor value and writes the loss config as text (map keys and text
// values come from the bytes as they are; the server's dump replaces what is
// not UTF-8).
#pragma once

#include "serve/tinker_wire.hpp"

inline void use_request(const rl::serve::tinker::ForwardBackwardRequest &fb) {
    double sum = 0;
    for (const auto &d : fb.data) {
        sum += static_cast<double>(d.tokens.size());
        for (const auto &[name, t] : d.inputs)
            for (size_t i = 0; i < t.numel(); ++i) sum += t.at(i);
    }
    volatile double sink = sum;
    (void)sink;
    (void)rl::serve::dump(fb.loss_fn_config);
}
