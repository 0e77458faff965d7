#include "train_common.hpp"
#include "rl/core/json.hpp"

namespace rl::host::capi {

namespace core = rl::core;
using nlohmann::json;

std::string fn_msg(const char *fn, const std::string &msg) {
    return std::string(fn) + ": " + msg;
}

json options_arg(const char *options_json, const char *fn) {
    json opts = parse_json(options_json, fn_msg(fn, "options"));
    if (opts.is_null()) opts = json::object();
    require(opts.is_object(), fn_msg(fn, "options must be a JSON object"));
    return opts;
}

void bad_option(const char *fn, const std::string &key, const char *valid) {
    throw HostError{
        RL_ERR_INVALID_ARG,
        fn_msg(fn, "option '" + key + "' is unknown or of the wrong type; valid: " + valid)};
}

core::Policy &policy_of(const rl_model_t *model, const char *fn) {
    if (!model->policy)
        throw HostError{RL_ERR_BAD_STATE,
                        fn_msg(fn, "this handle holds a tokenizer only (rl_tokenizer_load); load "
                                   "the model folder with rl_model_load")};
    return *model->policy;
}

const core::Tokenizer &tokenizer_of(const rl_model_t *model, const char *fn) {
    if (model->tokenizer) return *model->tokenizer;
    return policy_of(model, fn).require_tokenizer(fn);
}

std::vector<int32_t>
encode_chat_plain(const core::Tokenizer &tok, const std::vector<core::ChatMessage> &messages,
                  const std::function<std::string(const std::vector<core::ChatMessage> &)> &render,
                  std::string *rendered, const char *fn) {
    // Placeholders that no template alters and no content holds.
    std::vector<core::ChatMessage> slots = messages;
    std::vector<std::string> marks;
    for (size_t i = 0; i < messages.size(); ++i) {
        std::string m = "RLCONTENTSLOT" + std::to_string(i) + "X";
        while (messages[i].content.find(m) != std::string::npos) m += "X";
        marks.push_back(m);
        slots[i].content = m;
    }
    const std::string shape = render(slots);
    const std::string text = render(messages);
    // Rebuild the text from the shape, recording where each content lands.
    std::string rebuilt;
    core::EncodeOptions o;
    size_t at = 0;
    for (size_t i = 0; i < messages.size(); ++i) {
        const size_t p = shape.find(marks[i], at);
        if (p == std::string::npos || shape.find(marks[i], p + 1) != std::string::npos)
            throw HostError{RL_ERR_INVALID_ARG,
                            fn_msg(fn, "the chat template does not render message " +
                                           std::to_string(i) +
                                           "'s content exactly once, in order; its special-token "
                                           "text cannot be kept plain")};
        rebuilt += shape.substr(at, p - at);
        o.plain_spans.emplace_back(rebuilt.size(), rebuilt.size() + messages[i].content.size());
        rebuilt += messages[i].content;
        at = p + marks[i].size();
    }
    rebuilt += shape.substr(at);
    if (rebuilt != text)
        throw HostError{RL_ERR_INVALID_ARG,
                        fn_msg(fn, "the chat template alters the message contents (trimming, "
                                   "rewriting); their special-token text cannot be kept plain")};
    if (rendered) *rendered = text;
    return tok.encode(text, o);
}

json parse_json(const char *text, const std::string &what) {
    if (text == nullptr) return json();
    json j;
    std::string error;
    if (!rl::core::try_parse_json(text, j, what, &error))
        throw HostError{RL_ERR_INVALID_ARG, error};
    return j;
}

// ---- tensors ----------------------------------------------------------------

namespace {

// The ABI dtypes that have a torch scalar type (lanes 1), both ways.
struct DtypeRow {
    at::ScalarType torch;
    rl_dtype_t abi;
};
const DtypeRow kDtypes[] = {
    {at::kFloat, {RL_DTYPE_FLOAT, 32, 1}}, {at::kDouble, {RL_DTYPE_FLOAT, 64, 1}},
    {at::kHalf, {RL_DTYPE_FLOAT, 16, 1}},  {at::kBFloat16, {RL_DTYPE_BFLOAT, 16, 1}},
    {at::kLong, {RL_DTYPE_INT, 64, 1}},    {at::kInt, {RL_DTYPE_INT, 32, 1}},
    {at::kShort, {RL_DTYPE_INT, 16, 1}},   {at::kChar, {RL_DTYPE_INT, 8, 1}},
    {at::kByte, {RL_DTYPE_UINT, 8, 1}},    {at::kBool, {RL_DTYPE_BOOL, 8, 1}}};

} // namespace

at::ScalarType scalar_type_of(rl_dtype_t d, const std::string &what) {
    for (const auto &row : kDtypes)
        if (row.abi.code == d.code && row.abi.bits == d.bits && row.abi.lanes == d.lanes)
            return row.torch;
    throw HostError{RL_ERR_UNSUPPORTED,
                    what + ": dtype " + rl::host::dtype_string(d) + " is not supported"};
}

rl_dtype_t dtype_of(at::ScalarType t) {
    for (const auto &row : kDtypes)
        if (row.torch == t) return row.abi;
    throw HostError{RL_ERR_INTERNAL, std::string("no ABI dtype for ") + c10::toString(t)};
}

at::Tensor tensor_from_owned(const OwnedTensor &o, const std::string &what) {
    at::Tensor t = at::empty(o.shape, at::TensorOptions().dtype(scalar_type_of(o.dtype, what)));
    if (!o.bytes.empty()) std::memcpy(t.data_ptr(), o.bytes.data(), o.bytes.size());
    return t;
}

at::Tensor tensor_from_view(const rl_tensor_view_t &v, const std::string &what) {
    OwnedTensor o;
    try {
        o = OwnedTensor::copy_of(v);
    } catch (const HostError &e) {
        throw HostError{e.status, what + ": " + e.message};
    }
    return tensor_from_owned(o, what);
}

OwnedTensor owned_from_tensor(const at::Tensor &t) {
    at::Tensor c = t.to(at::kCPU).contiguous();
    OwnedTensor o;
    o.dtype = dtype_of(c.scalar_type());
    o.shape.assign(c.sizes().begin(), c.sizes().end());
    o.bytes.resize(static_cast<size_t>(c.numel()) * c.element_size());
    if (!o.bytes.empty()) std::memcpy(o.bytes.data(), c.data_ptr(), o.bytes.size());
    return o;
}

std::vector<int64_t> int_vector(const rl_tensor_view_t &v, const std::string &what) {
    at::Tensor t = tensor_from_view(v, what);
    if (t.dim() != 1) throw HostError{RL_ERR_INVALID_ARG, what + " must be 1-D"};
    if (!at::isIntegralType(t.scalar_type(), /*includeBool=*/false))
        throw HostError{RL_ERR_INVALID_ARG, what + " must be an integer tensor (int64), got " +
                                                c10::toString(t.scalar_type())};
    t = t.to(at::kLong).contiguous();
    return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
}

} // namespace rl::host::capi
