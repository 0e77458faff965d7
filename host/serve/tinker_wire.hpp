// host/serve/tinker_wire.hpp: the data of the Tinker training API
// (docs/training-server.md) on its two wires: JSON (every SDK release; xorl's
// dialect too) and protobuf (package tinker_public; the SDK sends
// forward_backward as protobuf from 0.25 on and asks for ForwardBackwardOutput
// and SampleResponse as protobuf). Only the messages the server reads or
// writes are coded, by hand (no protobuf library): varints, length-delimited
// fields, packed little-endian arrays.
//
// Parsing errors are ApiError 400 naming the field
// ("forward_backward_input.data[2].loss_fn_inputs.weights").
#pragma once

#include "fields.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace rl::serve::tinker {

using nlohmann::json;

/// The most values one TensorData may hold once dense (2^26: a sparse CSR
/// tensor [tokens, vocab] is densified, so its shape alone could otherwise ask
/// for any amount of memory). A larger shape is refused with 400.
inline constexpr int64_t kMaxTensorValues = int64_t{1} << 26;

/// A TensorData, dense and row-major: int64 or float (float32 on the wire).
struct Tensor {
    bool is_int = false;
    std::vector<int64_t> shape;
    std::vector<int64_t> ints;
    std::vector<double> floats;
    size_t numel() const { return is_int ? ints.size() : floats.size(); }
    double at(size_t i) const { return is_int ? static_cast<double>(ints[i]) : floats[i]; }
};

/// One training example: the model input (concatenated text chunks) and the
/// per-token loss inputs by name.
struct Datum {
    std::vector<int64_t> tokens;
    /// The model input came as xorl's {"input_ids": [...]}.
    bool xorl_input_ids = false;
    std::vector<std::pair<std::string, Tensor>> inputs;
};

/// A forward_backward (or forward) request, from either wire.
struct ForwardBackwardRequest {
    std::string model_id;
    std::optional<int64_t> seq_id;
    std::vector<Datum> data;
    std::string loss_fn;
    json loss_fn_config = json::object(); ///< numbers and strings by name
    bool forward_only = false;
};

/// Reads a JSON TensorData ({"data", "dtype", "shape", sparse CSR indices}),
/// or a bare list of numbers (xorl). `name` is the field for errors.
Tensor tensor_from_json(const json &j, const std::string &name);
/// Reads a JSON ModelInput: {"chunks": [{"type"?: "encoded_text", "tokens"}]}
/// or xorl's {"input_ids": [...]}. Image and audio chunks are refused.
std::vector<int64_t> model_input_from_json(const json &j, const std::string &name,
                                           bool *xorl = nullptr);
/// The body of /api/v1/forward_backward (input under "forward_backward_input")
/// or /api/v1/forward ("forward_input"); xorl's "loss_fn_params" is read as
/// loss_fn_config.
ForwardBackwardRequest forward_backward_from_json(const json &body, bool forward_only);
/// A serialized tinker_public.ForwardBackwardRequest.
ForwardBackwardRequest forward_backward_from_proto(std::string_view bytes);

/// The result of forward / forward_backward.
struct ForwardBackwardOutput {
    std::string loss_fn_output_type = "TensorLossReturn";
    /// Per datum: float32 vectors by field name ("logprobs", "elementwise_loss").
    std::vector<std::vector<std::pair<std::string, std::vector<float>>>> outputs;
    std::map<std::string, double> metrics; ///< keys "name:reduction"
};
json to_json(const ForwardBackwardOutput &out);
std::string to_proto(const ForwardBackwardOutput &out);

struct SampledSequence {
    std::vector<int64_t> tokens;
    std::vector<float> logprobs;
    bool stopped_by_length = false;
};

struct SampleOutput {
    std::vector<SampledSequence> sequences;
    /// One per prompt token; the first has no context (null / NaN).
    std::optional<std::vector<double>> prompt_logprobs;
};
json to_json(const SampleOutput &out);
std::string to_proto(const SampleOutput &out);

} // namespace rl::serve::tinker
