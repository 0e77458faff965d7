// lora_peft.hpp (private to rl_core): reading PEFT's adapter_config.json and
// the fused-expert layout PEFT writes over transformers >= 5 (docs/lora.md,
// "Mixture-of-experts models").
//
// PEFT (0.21) adapts transformers 5's fused 3-D expert parameters through
// `target_parameters` (lora.ParamWrapper): for a parameter of E experts
// stored [E, out, in] (Qwen3-MoE's and Qwen2-MoE's experts.gate_up_proj
// [E, 2 I, H] and experts.down_proj [E, H, I]) and per-expert rank r it keeps
// one pair
//
//   lora_A.weight [r E, in]    row e r + k is expert e's k-th row of A_e
//   lora_B.weight [out, r E]   column k E + e is expert e's k-th column of B_e
//
// and expert e's delta is s B_e A_e ([out, in], s = alpha / r or alpha /
// sqrt(r)). gate_up_proj's rows 0..I-1 are the gate projection, I..2I-1 the
// up projection. Two parameters of one module nest: the wrapper of the first
// registered parameter (gate_up_proj) becomes the base layer of the second's,
// so its keys read "mlp.experts.base_layer.lora_A.weight" and down_proj's
// "mlp.experts.lora_A.weight" (one targeted parameter: no "base_layer").
#pragma once

#include "rl/core/lora.hpp"

#include <ATen/Tensor.h>

#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <vector>

namespace rl::core {

class CausalLM;

namespace peft {

/// adapter_config.json as read: our LoRA config plus what only a model can
/// check.
struct AdapterFile {
    std::string path; ///< the adapter_config.json read
    /// r, lora_alpha, lora_dropout, use_rslora, base_model_name_or_path and
    /// the targets: target_modules with the modules target_parameters
    /// implies (gate_up_proj: gate_proj and up_proj; down_proj: down_proj).
    LoraConfig config;
    std::vector<std::string> target_modules;    ///< as the file lists them
    std::vector<std::string> target_parameters; ///< as the file lists them
    /// PEFT's per-module patterns, in the file's order (the first matching
    /// key wins in PEFT); empty objects when unset.
    nlohmann::ordered_json rank_pattern = nlohmann::ordered_json::object();
    nlohmann::ordered_json alpha_pattern = nlohmann::ordered_json::object();
};

/// Reads `dir`/adapter_config.json. Refuses (naming the file and key) another
/// peft_type, DoRA, bias, fan_in_fan_out, modules_to_save,
/// layers_to_transform / layers_pattern, malformed target_parameters or
/// patterns, and a target_parameters entry that is not a fused expert
/// projection (its last name gate_up_proj or down_proj).
AdapterFile read_adapter_file(const std::string &dir);

/// Checks the file's targets and patterns against `model` and `adapter` (a
/// fresh adapter of file.config over it) and rewrites the fused-layout
/// tensors of `tensors` (keys without the adapter name) into the per-expert
/// keys of `adapter` (...mlp.experts.<E>.gate_proj.lora_A.weight), each
/// expert's delta equal to PEFT's. Refuses, naming the key or tensor and why,
/// what per-expert pairs of one rank and one scale cannot hold exactly.
/// `source` names the weights file in errors.
void convert_to_per_expert(const CausalLM &model, const AdapterFile &file,
                           const LoraAdapter &adapter, std::map<std::string, at::Tensor> &tensors,
                           const std::string &source);

} // namespace peft
} // namespace rl::core
