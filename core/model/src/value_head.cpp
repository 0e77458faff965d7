#include "rl/core/value_head.hpp"

#include "rl/core/error.hpp"
#include "rl/core/tensor_io.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/CPUGeneratorImpl.h>

#include <map>

namespace rl::core {

ValueHead::ValueHead(int64_t hidden, at::Device device) : hidden_(hidden) {
    check(hidden > 0, "value head: hidden size must be positive");
    const auto o = at::TensorOptions().dtype(at::kFloat).device(device);
    weight = register_parameter("weight", at::empty({1, hidden}, o));
    bias = register_parameter("bias", at::zeros({1}, o));
}

void ValueHead::init_weights(uint64_t seed, double std) {
    at::NoGradGuard no_grad;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    at::Tensor t = at::empty({1, hidden_}, at::kFloat);
    t.normal_(0.0, std, gen);
    weight.copy_(t);
    bias.zero_();
}

at::Tensor ValueHead::forward(const at::Tensor &hidden) const {
    check(hidden.dim() == 2 && hidden.size(1) == hidden_,
          "value head: hidden states must be [tokens, " + std::to_string(hidden_) + "]");
    const at::Tensor h = hidden.scalar_type() == at::kFloat ? hidden : hidden.to(at::kFloat);
    return at::addmm(bias, h, weight.t()).squeeze(1);
}

std::vector<std::pair<std::string, at::Tensor>> ValueHead::named_weights() const {
    return {{"value_head.weight", weight}, {"value_head.bias", bias}};
}

void ValueHead::save(const std::string &file) const {
    save_safetensors(file, named_weights(), {{"format", "pt"}, {"kind", "value_head"}});
}

std::map<std::string, at::Tensor> ValueHead::read(const std::string &file) const {
    std::map<std::string, at::Tensor> t = load_safetensors(file);
    for (const auto &[name, p] : named_weights()) {
        auto it = t.find(name);
        if (it == t.end()) throw Error(file + ": tensor '" + name + "' is missing");
        if (!it->second.sizes().equals(p.sizes()))
            throw Error(file + ": tensor '" + name + "' has shape " + c10::str(it->second.sizes()) +
                        ", the value head of this model has " + c10::str(p.sizes()));
    }
    if (t.size() != 2) {
        for (const auto &kv : t)
            if (kv.first != "value_head.weight" && kv.first != "value_head.bias")
                throw Error(file + ": unexpected tensor '" + kv.first +
                            "' (a value head holds value_head.weight and value_head.bias)");
    }
    return t;
}

void ValueHead::load(const std::string &file) {
    const auto t = read(file);
    at::NoGradGuard no_grad;
    weight.copy_(t.at("value_head.weight"));
    bias.copy_(t.at("value_head.bias"));
}

} // namespace rl::core
