#include "jinja.hpp"

#include "rl/core/error.hpp"
#include "rl/core/text.hpp"
#include "unicode.hpp"

#include <utf8proc.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <ctime>
#include <functional>
#include <map>
#include <set>
#include <unordered_map>
#include <vector>

#include <pthread.h>

namespace rl::core::jinja {
namespace {

using Json = nlohmann::ordered_json;

// An error while rendering; `line` 0 until the evaluator knows where.
struct JError {
    std::string msg;
    int line = 0;
};

[[noreturn]] void fail(const std::string &msg) {
    throw JError{msg, 0};
}

// ---------------------------------------------------------------------------
// Limits. A chat template comes with a model and is rendered inside the server
// on every chat request, so a broken or hostile one must fail with an error
// naming its line, never overflow the stack, hang, or exhaust the memory. Each
// limit is far above what real templates need (documented in docs/model.md,
// "Limits of the engine").

// Statements nested in each other, plus parentheses and unary operators nested
// in one expression (the parser's own recursion).
constexpr int kMaxNesting = 200;
// Depth of one expression's tree: every operator, filter, test, call, attribute,
// subscript and parenthesis level counts one (`1+1+...+1` with 300 `+` is 300).
constexpr int kMaxExprDepth = 256;
// Lists / dicts nested in each other that are printed, serialised (tojson),
// compared or read from the context.
constexpr int kMaxValueDepth = 512;
// Macro calls nested in each other (recursion).
constexpr int kMaxMacroDepth = 100;
// Evaluation frames nested at run time (expressions, statements, filters and
// macro calls together).
constexpr int kMaxRecursion = 1000;
// The stack one render may use below its start, whatever the build (a frame
// takes ~1 KiB optimised, ~6 KiB in an -O0 sanitizer build); less where the
// thread has less left, keeping kStackMargin for the C++ library and the
// error's unwinding.
constexpr uintptr_t kMaxStackBytes = uintptr_t{4} << 20;
constexpr uintptr_t kStackMargin = uintptr_t{256} << 10;
// Any string a template builds (repetition, concatenation, join, replace,
// indent, tojson, printing a list, ...).
constexpr size_t kMaxStringBytes = size_t{64} << 20;
// The rendered text, and the text of a {% set %} / {% filter %} block or macro.
constexpr size_t kMaxOutputBytes = size_t{64} << 20;
// Items of any list a template builds (repetition, concatenation, range(), a
// filter's result).
constexpr size_t kMaxListItems = 1000000;
// Work one render may do, in units of about 50 ns: one expression or statement
// evaluated, one loop iteration, one item visited by a built-in, one byte of a
// string split into characters (trim, upper, slicing, ...) or 32 bytes of one
// copied or searched. About a second of CPU time; a chat template on a long
// conversation uses a few hundred thousand.
constexpr int64_t kMaxWork = 20000000;

std::string mib(size_t bytes) {
    return std::to_string(bytes >> 20) + " MiB";
}

// The work left to the render running on this thread.
thread_local int64_t work_left = kMaxWork;

void charge(int64_t units) {
    work_left -= units;
    if (work_left < 0)
        fail("the template does too much work (over " + std::to_string(kMaxWork) +
             " steps: a loop, repetition or operation on too large an input)");
}
void charge_bytes(size_t bytes) {
    charge(static_cast<int64_t>(bytes / 32) + 1);
}
// Fails on a string a template builds past kMaxStringBytes.
void check_size(const std::string &s, const char *what) {
    if (s.size() > kMaxStringBytes)
        fail(std::string(what) + ": the result is longer than " + mib(kMaxStringBytes));
}

// ---------------------------------------------------------------------------
// Values (Python semantics)

struct Value;
using List = std::vector<Value>;
struct Dict;
struct Args;
using Fn = std::function<Value(Args &)>;

struct Value {
    enum Kind { Undefined, None, Bool, Int, Float, Str, ListK, DictK, Func } k = Undefined;
    bool b = false;
    bool tuple = false;     // a list that Python would hold as a tuple (repr only)
    bool generator = false; // a lazy sequence in Jinja (map, select, ...): no len, no json
    bool markup = false;    // a markupsafe.Markup string (| safe): `+` escapes the other side
    int64_t i = 0;
    double f = 0;
    std::string s; // the string, or for Undefined a description of what is missing
    std::shared_ptr<List> l;
    std::shared_ptr<Dict> d;
    std::shared_ptr<Fn> fn;

    static Value undefined(std::string why = {}) {
        Value v;
        v.s = std::move(why);
        return v;
    }
    // A value of kind `kind` whose `field` holds x.
    template <class T, class X>
    static Value of(Kind kind, T Value::*field, X &&x) {
        Value v;
        v.k = kind;
        v.*field = std::forward<X>(x);
        return v;
    }
    static Value none() {
        Value v;
        v.k = None;
        return v;
    }
    static Value boolean(bool x) { return of(Bool, &Value::b, x); }
    static Value integer(int64_t x) { return of(Int, &Value::i, x); }
    static Value real(double x) { return of(Float, &Value::f, x); }
    // A string or list the template builds: counted as work, refused past the
    // limits. The context's values and the template's literals are not (raw).
    static Value str(std::string x) {
        check_size(x, "string");
        charge_bytes(x.size());
        return raw_str(std::move(x));
    }
    static Value raw_str(std::string x) { return of(Str, &Value::s, std::move(x)); }
    static Value list(List x = {});
    static Value raw_list(List x);
    static Value gen(List x) {
        Value v = list(std::move(x));
        v.generator = true;
        return v;
    }
    static Value dict();
    static Value func(Fn f) { return of(Func, &Value::fn, std::make_shared<Fn>(std::move(f))); }
};

struct Dict {
    std::vector<std::pair<std::string, Value>> items;
    bool is_namespace = false;
    // Linear (dicts in chat templates are small); counted as work.
    const Value *find(const std::string &key) const {
        charge(static_cast<int64_t>(items.size() / 16) + 1);
        for (const auto &kv : items)
            if (kv.first == key) return &kv.second;
        return nullptr;
    }
    void set(const std::string &key, Value v) {
        charge(static_cast<int64_t>(items.size() / 16) + 1);
        for (auto &kv : items)
            if (kv.first == key) {
                kv.second = std::move(v);
                return;
            }
        items.emplace_back(key, std::move(v));
    }
};

// Lists and dicts are freed through a queue rather than recursively, so that
// dropping a value nested 100,000 deep (a namespace can chain them without
// bound) cannot overflow the stack: a container whose last owner goes while
// another one is being freed waits in the queue.
struct Reaper {
    std::vector<List *> lists;
    std::vector<Dict *> dicts;
    bool draining = false;
};
thread_local Reaper reaper;

template <class C>
void reap(C *c, std::vector<C *> &queue) noexcept {
    if (reaper.draining) {
        queue.push_back(c);
        return;
    }
    reaper.draining = true;
    delete c;
    while (!reaper.lists.empty() || !reaper.dicts.empty()) {
        if (!reaper.lists.empty()) {
            List *l = reaper.lists.back();
            reaper.lists.pop_back();
            delete l;
        } else {
            Dict *d = reaper.dicts.back();
            reaper.dicts.pop_back();
            delete d;
        }
    }
    reaper.draining = false;
}

Value Value::raw_list(List x) {
    return of(ListK, &Value::l, std::shared_ptr<List>(new List(std::move(x)), [](List *l) {
                  reap(l, reaper.lists);
              }));
}

Value Value::list(List x) {
    if (x.size() > kMaxListItems)
        fail("a list of more than " + std::to_string(kMaxListItems) + " items");
    charge(static_cast<int64_t>(x.size()) + 1);
    return raw_list(std::move(x));
}

Value Value::dict() {
    charge(1);
    return of(DictK, &Value::d,
              std::shared_ptr<Dict>(new Dict(), [](Dict *d) { reap(d, reaper.dicts); }));
}

struct Args {
    std::vector<Value> pos;
    std::vector<std::pair<std::string, Value>> kw;

    // Positional i, else keyword `name`, else nullptr.
    const Value *get(size_t i, const char *name) const {
        if (i < pos.size()) return &pos[i];
        for (const auto &kv : kw)
            if (kv.first == name) return &kv.second;
        return nullptr;
    }
    // Refuses arguments beyond the names a function takes, a name given twice,
    // and a missing one of the first `required` names.
    void expect(const std::string &fn, std::initializer_list<const char *> names,
                size_t required = 0) const {
        if (pos.size() > names.size())
            fail(fn + "() takes at most " + std::to_string(names.size()) + " argument" +
                 (names.size() == 1 ? "" : "s") + " (" + std::to_string(pos.size()) + " given)");
        for (const auto &kv : kw) {
            size_t at = names.size();
            size_t i = 0;
            for (const char *n : names) {
                if (kv.first == n) at = i;
                ++i;
            }
            if (at == names.size())
                fail(fn + "() got an unexpected keyword argument '" + kv.first + "'");
            if (at < pos.size())
                fail(fn + "() got multiple values for argument '" + kv.first + "'");
        }
        size_t i = 0;
        for (const char *n : names) {
            if (i >= required) break;
            if (!get(i, n)) fail(fn + "() missing required argument '" + n + "'");
            ++i;
        }
    }
};

const char *type_name(const Value &v) {
    switch (v.k) {
        case Value::Undefined:
            return "undefined";
        case Value::None:
            return "NoneType";
        case Value::Bool:
            return "bool";
        case Value::Int:
            return "int";
        case Value::Float:
            return "float";
        case Value::Str:
            return "str";
        case Value::ListK:
            return v.generator ? "generator" : v.tuple ? "tuple" : "list";
        case Value::DictK:
            return v.d->is_namespace ? "namespace" : "dict";
        case Value::Func:
            return "function";
    }
    return "?";
}

[[noreturn]] void fail_undefined(const Value &v) {
    fail(v.s.empty() ? std::string("undefined value used") : v.s);
}

bool truthy(const Value &v) {
    switch (v.k) {
        case Value::Undefined:
        case Value::None:
            return false;
        case Value::Bool:
            return v.b;
        case Value::Int:
            return v.i != 0;
        case Value::Float:
            return v.f != 0;
        case Value::Str:
            return !v.s.empty();
        case Value::ListK:
            return v.generator || !v.l->empty();
        case Value::DictK:
            return v.d->is_namespace || !v.d->items.empty();
        case Value::Func:
            return true;
    }
    return false;
}

bool is_number(const Value &v) {
    return v.k == Value::Bool || v.k == Value::Int || v.k == Value::Float;
}
bool is_intlike(const Value &v) {
    return v.k == Value::Bool || v.k == Value::Int;
}
int64_t as_int(const Value &v) {
    return v.k == Value::Bool ? (v.b ? 1 : 0) : v.i;
}
double as_double(const Value &v) {
    return v.k == Value::Float ? v.f : static_cast<double>(as_int(v));
}

// Python's repr(float).
std::string py_float(double d) {
    if (std::isnan(d)) return "nan";
    if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
    char buf[64];
    for (int p = 1; p <= 17; ++p) {
        std::snprintf(buf, sizeof buf, "%.*e", p - 1, d);
        if (std::strtod(buf, nullptr) == d) break;
    }
    std::string m = buf;
    const size_t e = m.find('e');
    const int exp = std::atoi(m.c_str() + e + 1);
    std::string mant = m.substr(0, e);
    const bool neg = mant[0] == '-';
    std::string digits;
    for (char c : mant)
        if (c >= '0' && c <= '9') digits += c;
    while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
    std::string s;
    if (exp < -4 || exp >= 16) {
        s = digits.substr(0, 1);
        if (digits.size() > 1) s += "." + digits.substr(1);
        const int a = std::abs(exp);
        s += std::string("e") + (exp < 0 ? "-" : "+") + (a < 10 ? "0" : "") + std::to_string(a);
    } else if (exp >= 0) {
        const size_t int_len = static_cast<size_t>(exp) + 1;
        if (digits.size() <= int_len)
            s = digits + std::string(int_len - digits.size(), '0') + ".0";
        else
            s = digits.substr(0, int_len) + "." + digits.substr(int_len);
    } else {
        s = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    }
    return neg ? "-" + s : s;
}

std::string py_repr(const Value &v);

// Fails where a recursive walk over a value (printing, tojson, ==, <, reading
// the context) would go deeper than kMaxValueDepth.
void check_depth(int depth, const char *what) {
    if (depth > kMaxValueDepth)
        fail(std::string(what) + ": lists / dicts nested deeper than " +
             std::to_string(kMaxValueDepth) + " levels");
}

// Python's str().
std::string to_str(const Value &v) {
    switch (v.k) {
        case Value::Undefined:
            return "";
        case Value::None:
            return "None";
        case Value::Bool:
            return v.b ? "True" : "False";
        case Value::Int:
            return std::to_string(v.i);
        case Value::Float:
            return py_float(v.f);
        case Value::Str:
            return v.s;
        case Value::Func:
            return "<function>";
        case Value::ListK:
            if (v.generator)
                fail("unsupported: printing a generator (Python prints its address; add '| list')");
            [[fallthrough]];
        case Value::DictK:
            return py_repr(v);
    }
    return "";
}

std::string py_str_repr(const std::string &s) {
    charge_bytes(s.size());
    const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
    const char q = dq ? '"' : '\'';
    std::string out(1, q);
    for (unsigned char c : s) {
        if (c == '\\')
            out += "\\\\";
        else if (c == static_cast<unsigned char>(q))
            out += std::string("\\") + static_cast<char>(q);
        else if (c == '\n')
            out += "\\n";
        else if (c == '\r')
            out += "\\r";
        else if (c == '\t')
            out += "\\t";
        else if (c < 0x20 || c == 0x7f) {
            char buf[16];
            std::snprintf(buf, sizeof buf, "\\x%02x", c);
            out += buf;
        } else
            out += static_cast<char>(c);
    }
    return out + q;
}

void repr_into(const Value &v, std::string &out, int depth) {
    charge(1);
    switch (v.k) {
        case Value::Str:
            out += py_str_repr(v.s);
            break;
        case Value::ListK: {
            check_depth(depth + 1, "printing a value");
            out += v.tuple ? "(" : "[";
            for (size_t i = 0; i < v.l->size(); ++i) {
                if (i) out += ", ";
                repr_into((*v.l)[i], out, depth + 1);
                check_size(out, "printing a value");
            }
            if (v.tuple && v.l->size() == 1) out += ",";
            out += v.tuple ? ")" : "]";
            break;
        }
        case Value::DictK: {
            if (v.d->is_namespace) {
                out += "<Namespace>";
                break;
            }
            check_depth(depth + 1, "printing a value");
            out += "{";
            bool first = true;
            for (const auto &kv : v.d->items) {
                if (!first) out += ", ";
                out += py_str_repr(kv.first) + ": ";
                repr_into(kv.second, out, depth + 1);
                check_size(out, "printing a value");
                first = false;
            }
            out += "}";
            break;
        }
        default:
            out += to_str(v);
    }
}

std::string py_repr(const Value &v) {
    std::string out;
    repr_into(v, out, 0);
    return out;
}

// Python's json.dumps(ensure_ascii=False) of a string.
std::string json_string(const std::string &s, bool ensure_ascii) {
    charge_bytes(s.size());
    std::string out = "\"";
    for (size_t i = 0; i < s.size(); ++i) {
        const unsigned char c = static_cast<unsigned char>(s[i]);
        switch (c) {
            case '"':
                out += "\\\"";
                break;
            case '\\':
                out += "\\\\";
                break;
            case '\n':
                out += "\\n";
                break;
            case '\r':
                out += "\\r";
                break;
            case '\t':
                out += "\\t";
                break;
            case '\b':
                out += "\\b";
                break;
            case '\f':
                out += "\\f";
                break;
            default:
                if (c < 0x20) {
                    char buf[16];
                    std::snprintf(buf, sizeof buf, "\\u%04x", c);
                    out += buf;
                } else if (c >= 0x80 && ensure_ascii) {
                    utf8proc_int32_t cp = 0;
                    const auto n =
                        utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t *>(s.data() + i),
                                         static_cast<utf8proc_ssize_t>(s.size() - i), &cp);
                    if (n <= 0) fail("tojson: invalid UTF-8");
                    auto put = [&](unsigned u) {
                        char buf[16];
                        std::snprintf(buf, sizeof buf, "\\u%04x", u);
                        out += buf;
                    };
                    if (cp >= 0x10000) {
                        const unsigned x = static_cast<unsigned>(cp) - 0x10000;
                        put(0xD800 + (x >> 10));
                        put(0xDC00 + (x & 0x3FF));
                    } else
                        put(static_cast<unsigned>(cp));
                    i += static_cast<size_t>(n) - 1;
                } else
                    out += static_cast<char>(c);
        }
    }
    return out + "\"";
}

struct JsonStyle {
    bool ensure_ascii = false;
    std::optional<std::string> indent;
    std::string item_sep = ", ", key_sep = ": ";
    bool sort_keys = false;
};

void to_json(const Value &v, const JsonStyle &st, int depth, std::string &out) {
    charge(1);
    switch (v.k) {
        case Value::None:
            out += "null";
            return;
        case Value::Bool:
            out += v.b ? "true" : "false";
            return;
        case Value::Int:
            out += std::to_string(v.i);
            return;
        case Value::Float:
            if (std::isnan(v.f))
                out += "NaN";
            else if (std::isinf(v.f))
                out += v.f < 0 ? "-Infinity" : "Infinity";
            else
                out += py_float(v.f);
            return;
        case Value::Str:
            out += json_string(v.s, st.ensure_ascii);
            return;
        case Value::ListK:
        case Value::DictK: {
            const bool is_list = v.k == Value::ListK;
            if (is_list && v.generator) fail("Object of type generator is not JSON serializable");
            if (!is_list && v.d->is_namespace) fail("tojson: a namespace is not JSON serializable");
            check_depth(depth + 1, "tojson");
            const size_t n = is_list ? v.l->size() : v.d->items.size();
            if (n == 0) {
                out += is_list ? "[]" : "{}";
                return;
            }
            std::vector<size_t> order(n);
            for (size_t i = 0; i < n; ++i) order[i] = i;
            if (!is_list && st.sort_keys)
                std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
                    return v.d->items[a].first < v.d->items[b].first;
                });
            out += is_list ? "[" : "{";
            auto newline = [&](int d) {
                if (!st.indent) return;
                out += "\n";
                for (int k = 0; k < d; ++k) out += *st.indent;
            };
            for (size_t j = 0; j < n; ++j) {
                if (j) out += st.item_sep;
                newline(depth + 1);
                if (is_list) {
                    to_json((*v.l)[j], st, depth + 1, out);
                } else {
                    const auto &kv = v.d->items[order[j]];
                    out += json_string(kv.first, st.ensure_ascii) + st.key_sep;
                    to_json(kv.second, st, depth + 1, out);
                }
                check_size(out, "tojson");
            }
            newline(depth);
            out += is_list ? "]" : "}";
            return;
        }
        case Value::Undefined:
            fail("tojson: Object of type Undefined is not JSON serializable");
        case Value::Func:
            fail("tojson: a function is not JSON serializable");
    }
}

Value pair(std::string k, Value v) {
    Value p = Value::list({Value::str(std::move(k)), std::move(v)});
    p.tuple = true;
    return p;
}

// The context's values are taken as they are (no size limits: the caller's
// input), only their depth is bounded.
Value from_json(const Json &j, int depth = 0) {
    switch (j.type()) {
        case Json::value_t::null:
            return Value::none();
        case Json::value_t::boolean:
            return Value::boolean(j.get<bool>());
        case Json::value_t::number_integer:
            return Value::integer(j.get<int64_t>());
        case Json::value_t::number_unsigned:
            return Value::integer(static_cast<int64_t>(j.get<uint64_t>()));
        case Json::value_t::number_float:
            return Value::real(j.get<double>());
        case Json::value_t::string:
            return Value::raw_str(j.get<std::string>());
        case Json::value_t::array: {
            check_depth(depth + 1, "the template context");
            List l;
            l.reserve(j.size());
            for (const auto &e : j) l.push_back(from_json(e, depth + 1));
            return Value::raw_list(std::move(l));
        }
        case Json::value_t::object: {
            check_depth(depth + 1, "the template context");
            Value d = Value::dict();
            // A JSON object's keys are unique: no look-up per key.
            d.d->items.reserve(j.size());
            for (auto it = j.begin(); it != j.end(); ++it)
                d.d->items.emplace_back(it.key(), from_json(it.value(), depth + 1));
            return d;
        }
        default:
            fail("unsupported JSON value in the template context");
    }
}

bool equal(const Value &a, const Value &b, int depth = 0) {
    charge(1);
    if (is_number(a) && is_number(b)) {
        if (is_intlike(a) && is_intlike(b)) return as_int(a) == as_int(b);
        return as_double(a) == as_double(b);
    }
    if (a.k != b.k) return false;
    switch (a.k) {
        case Value::Undefined:
        case Value::None:
            return true;
        case Value::Str:
            if (a.s.size() == b.s.size()) charge_bytes(a.s.size());
            return a.s == b.s;
        case Value::ListK:
            if (a.l == b.l) return true; // Python: the same items are equal
            if (a.l->size() != b.l->size()) return false;
            check_depth(depth + 1, "comparing values");
            for (size_t i = 0; i < a.l->size(); ++i)
                if (!equal((*a.l)[i], (*b.l)[i], depth + 1)) return false;
            return true;
        case Value::DictK:
            if (a.d == b.d) return true;
            if (a.d->is_namespace || b.d->is_namespace) return false;
            if (a.d->items.size() != b.d->items.size()) return false;
            check_depth(depth + 1, "comparing values");
            for (const auto &kv : a.d->items) {
                const Value *o = b.d->find(kv.first);
                if (!o || !equal(kv.second, *o, depth + 1)) return false;
            }
            return true;
        case Value::Func:
            return a.fn == b.fn;
        default:
            return false;
    }
}

// -1, 0, 1; fails for types Python does not order.
int compare(const Value &a, const Value &b, const char *op, int depth = 0) {
    charge(1);
    if (is_number(a) && is_number(b)) {
        if (is_intlike(a) && is_intlike(b))
            return as_int(a) < as_int(b) ? -1 : as_int(a) > as_int(b) ? 1 : 0;
        const double x = as_double(a), y = as_double(b);
        return x < y ? -1 : x > y ? 1 : 0;
    }
    if (a.k == Value::Str && b.k == Value::Str) {
        charge_bytes(std::min(a.s.size(), b.s.size()));
        return a.s.compare(b.s) < 0 ? -1 : a.s == b.s ? 0 : 1;
    }
    if (a.k == Value::ListK && b.k == Value::ListK) {
        check_depth(depth + 1, "comparing values");
        for (size_t i = 0; i < a.l->size() && i < b.l->size(); ++i) {
            if (equal((*a.l)[i], (*b.l)[i], depth + 1)) continue;
            return compare((*a.l)[i], (*b.l)[i], op, depth + 1);
        }
        return a.l->size() < b.l->size() ? -1 : a.l->size() > b.l->size() ? 1 : 0;
    }
    fail(std::string("'") + op + "' not supported between instances of '" + type_name(a) +
         "' and '" + type_name(b) + "'");
}

// UTF-8 code points of a string (each as its bytes).
// (About 40 ns a byte: one unit of work each.)
std::vector<std::string> chars_of(const std::string &s) {
    charge(static_cast<int64_t>(s.size()) + 1);
    std::vector<std::string> out;
    for (size_t i = 0; i < s.size();) {
        const size_t n = std::max<size_t>(1, std::min(unicode::char_len(s, i), s.size() - i));
        out.push_back(s.substr(i, n));
        i += n;
    }
    return out;
}

uint32_t decode_cp(const std::string &c) {
    utf8proc_int32_t cp = 0;
    utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t *>(c.data()),
                     static_cast<utf8proc_ssize_t>(c.size()), &cp);
    return cp < 0 ? 0xFFFD : static_cast<uint32_t>(cp);
}

std::vector<Value> iterate(const Value &v) {
    switch (v.k) {
        case Value::Undefined:
            return {};
        case Value::ListK:
            charge(static_cast<int64_t>(v.l->size()));
            return *v.l;
        case Value::DictK: {
            if (v.d->is_namespace) fail("'namespace' object is not iterable");
            std::vector<Value> keys;
            for (const auto &kv : v.d->items) keys.push_back(Value::str(kv.first));
            return keys;
        }
        case Value::Str: {
            std::vector<Value> out;
            for (auto &c : chars_of(v.s)) out.push_back(Value::str(std::move(c)));
            return out;
        }
        default:
            fail(std::string("'") + type_name(v) + "' object is not iterable");
    }
}

int64_t length(const Value &v) {
    switch (v.k) {
        case Value::Undefined:
            return 0;
        case Value::Str: {
            charge_bytes(v.s.size());
            int64_t n = 0;
            for (size_t i = 0; i < v.s.size(); ++n)
                i += std::max<size_t>(1, std::min(unicode::char_len(v.s, i), v.s.size() - i));
            return n;
        }
        case Value::ListK:
            if (v.generator) fail("object of type 'generator' has no len()");
            return static_cast<int64_t>(v.l->size());
        case Value::DictK:
            return static_cast<int64_t>(v.d->items.size());
        default:
            fail(std::string("object of type '") + type_name(v) + "' has no len()");
    }
}

// Counts an upper bound of the cost of looking for `needle` in `hay`
// (std::string::find is O(n m) at worst) before the search.
void charge_search(const std::string &hay, const std::string &needle) {
    const int64_t h = static_cast<int64_t>(hay.size() / 32) + 1;
    const int64_t n = static_cast<int64_t>(needle.size() / 32) + 1;
    charge(n > kMaxWork / h ? kMaxWork + 1 : h * n);
}

bool contains(const Value &container, const Value &item) {
    switch (container.k) {
        case Value::Undefined:
            return false;
        case Value::Str:
            if (item.k != Value::Str)
                fail(std::string("'in <string>' requires string as left operand, not ") +
                     type_name(item));
            charge_search(container.s, item.s);
            return container.s.find(item.s) != std::string::npos;
        case Value::ListK:
            for (const auto &e : *container.l)
                if (equal(e, item)) return true;
            return false;
        case Value::DictK:
            if (container.d->is_namespace) fail("'in' is not supported on a namespace");
            return item.k == Value::Str && container.d->find(item.s) != nullptr;
        default:
            fail(std::string("argument of type '") + type_name(container) + "' is not iterable");
    }
}

std::string str_arg(const Value *v, const char *what) {
    if (!v || v->k != Value::Str) fail(std::string(what) + " must be a string");
    return v->s;
}

int64_t int_arg(const Value *v, const char *what, int64_t dflt) {
    if (!v || v->k == Value::None) return dflt;
    if (!is_intlike(*v)) fail(std::string(what) + " must be an integer, not " + type_name(*v));
    return as_int(*v);
}

// Python str.strip / lstrip / rstrip with an optional set of characters.
std::string py_strip(const std::string &s, const Value *chars, bool left, bool right) {
    const auto cs = chars_of(s);
    std::vector<std::string> set;
    const bool ws = !chars || chars->k == Value::None;
    if (!ws) set = chars_of(str_arg(chars, "strip() argument"));
    auto drop = [&](const std::string &c) {
        if (ws) return unicode::is_space(decode_cp(c));
        return std::find(set.begin(), set.end(), c) != set.end();
    };
    size_t b = 0, e = cs.size();
    if (left)
        while (b < e && drop(cs[b])) ++b;
    if (right)
        while (e > b && drop(cs[e - 1])) --e;
    std::string out;
    for (size_t i = b; i < e; ++i) out += cs[i];
    return out;
}

std::string map_case(const std::string &s, int mode) { // 0 lower, 1 upper
    std::string out;
    for (const auto &c : chars_of(s)) {
        const uint32_t cp = decode_cp(c);
        const auto m = mode ? utf8proc_toupper(static_cast<utf8proc_int32_t>(cp))
                            : utf8proc_tolower(static_cast<utf8proc_int32_t>(cp));
        out += unicode::encode(static_cast<uint32_t>(m));
    }
    return out;
}

std::string capitalize(const std::string &s) {
    const auto cs = chars_of(s);
    std::string out;
    for (size_t i = 0; i < cs.size(); ++i) out += map_case(cs[i], i == 0 ? 1 : 0);
    return out;
}

std::string title(const std::string &s) {
    std::string out;
    bool prev_cased = false;
    for (const auto &c : chars_of(s)) {
        const auto cp = static_cast<utf8proc_int32_t>(decode_cp(c));
        const bool cased = utf8proc_toupper(cp) != cp || utf8proc_tolower(cp) != cp;
        out += map_case(c, prev_cased ? 0 : 1);
        prev_cased = cased;
    }
    return out;
}

std::vector<std::string> py_split(const std::string &s, const Value *sep, int64_t maxsplit) {
    std::vector<std::string> out;
    if (!sep || sep->k == Value::None) {
        const auto cs = chars_of(s);
        size_t i = 0;
        while (i < cs.size()) {
            while (i < cs.size() && unicode::is_space(decode_cp(cs[i]))) ++i;
            if (i == cs.size()) break;
            if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
                std::string rest;
                for (size_t j = i; j < cs.size(); ++j) rest += cs[j];
                // Python keeps trailing white space of the remainder.
                out.push_back(rest);
                return out;
            }
            std::string w;
            while (i < cs.size() && !unicode::is_space(decode_cp(cs[i]))) w += cs[i++];
            out.push_back(w);
            if (out.size() > kMaxListItems)
                fail("split(): more than " + std::to_string(kMaxListItems) + " parts");
        }
        return out;
    }
    const std::string sp = str_arg(sep, "split() separator");
    if (sp.empty()) fail("split(): empty separator");
    charge_search(s, sp);
    size_t start = 0;
    while (true) {
        if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) break;
        const size_t k = s.find(sp, start);
        if (k == std::string::npos) break;
        out.push_back(s.substr(start, k - start));
        if (out.size() > kMaxListItems)
            fail("split(): more than " + std::to_string(kMaxListItems) + " parts");
        start = k + sp.size();
    }
    out.push_back(s.substr(start));
    return out;
}

std::string py_replace(const std::string &s, const std::string &a, const std::string &b,
                       int64_t count) {
    std::string out;
    if (a.empty()) {
        // Python inserts `b` between every character (and at both ends).
        const auto cs = chars_of(s);
        int64_t n = 0;
        for (size_t i = 0; i <= cs.size(); ++i) {
            if (count < 0 || n < count) {
                out += b;
                ++n;
            }
            if (i < cs.size()) out += cs[i];
            check_size(out, "replace()");
        }
        return out;
    }
    charge_search(s, a);
    size_t start = 0;
    int64_t n = 0;
    while (count < 0 || n < count) {
        const size_t k = s.find(a, start);
        if (k == std::string::npos) break;
        out.append(s, start, k - start);
        out += b;
        check_size(out, "replace()");
        start = k + a.size();
        ++n;
    }
    out.append(s, start, std::string::npos);
    return out;
}

// Python slice semantics over n elements.
std::vector<int64_t> slice_indices(int64_t n, const Value &a, const Value &b, const Value &c) {
    auto opt = [](const Value &v, const char *what) -> std::optional<int64_t> {
        if (v.k == Value::Undefined || v.k == Value::None) return std::nullopt;
        if (!is_intlike(v)) fail(std::string("slice ") + what + " must be an integer");
        return as_int(v);
    };
    const int64_t step = opt(c, "step").value_or(1);
    if (step == 0) fail("slice step cannot be zero");
    auto start_o = opt(a, "start"), stop_o = opt(b, "stop");
    int64_t start, stop;
    auto clamp = [&](int64_t x, int64_t lo, int64_t hi) {
        if (x < 0) x += n;
        return std::min(std::max(x, lo), hi);
    };
    if (step > 0) {
        start = start_o ? clamp(*start_o, 0, n) : 0;
        stop = stop_o ? clamp(*stop_o, 0, n) : n;
    } else {
        start = start_o ? clamp(*start_o, -1, n - 1) : n - 1;
        stop = stop_o ? clamp(*stop_o, -1, n - 1) : -1;
    }
    // start and stop lie in [-1, n]: their distance fits, and so does each
    // index; a huge step gives one index (no overflow stepping past the end).
    uint64_t count = 0;
    if (step > 0 && stop > start)
        count = (static_cast<uint64_t>(stop - start) - 1) / static_cast<uint64_t>(step) + 1;
    else if (step < 0 && start > stop)
        count = (static_cast<uint64_t>(start - stop) - 1) / (0 - static_cast<uint64_t>(step)) + 1;
    charge(static_cast<int64_t>(count));
    std::vector<int64_t> idx;
    idx.reserve(count);
    // (k * step stays within the distance: k is 0, or the step is below it.)
    for (uint64_t k = 0; k < count; ++k) idx.push_back(start + static_cast<int64_t>(k) * step);
    return idx;
}

// Python str.format with {} / {0} / {name} fields (no format specs).
std::string py_format(const std::string &fmt, const Args &args) {
    std::string out;
    size_t auto_idx = 0;
    for (size_t i = 0; i < fmt.size(); ++i) {
        const char c = fmt[i];
        if (c == '{') {
            if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
                out += '{';
                ++i;
                continue;
            }
            const size_t e = fmt.find('}', i);
            if (e == std::string::npos) fail("format(): single '{' encountered");
            const std::string field = fmt.substr(i + 1, e - i - 1);
            if (field.find_first_of(":!.[") != std::string::npos)
                fail("format(): field '{" + field +
                     "}' uses a format spec, conversion or "
                     "attribute (not supported)");
            const Value *v = nullptr;
            if (field.empty()) {
                if (auto_idx >= args.pos.size()) fail("format(): not enough arguments");
                v = &args.pos[auto_idx++];
            } else if (field.size() < 10 && std::all_of(field.begin(), field.end(), [](char ch) {
                           return ch >= '0' && ch <= '9';
                       })) {
                const size_t k = std::stoul(field);
                if (k >= args.pos.size()) fail("format(): index " + field + " out of range");
                v = &args.pos[k];
            } else {
                for (const auto &kv : args.kw)
                    if (kv.first == field) v = &kv.second;
                if (!v) fail("format(): no argument named '" + field + "'");
            }
            out += to_str(*v);
            check_size(out, "format()");
            i = e;
        } else if (c == '}') {
            if (i + 1 < fmt.size() && fmt[i + 1] == '}') ++i;
            out += '}';
        } else
            out += c;
    }
    return out;
}

// ---------------------------------------------------------------------------
// Lexer

enum class T { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, Str, Int, Float, Op, End };

struct Tok {
    T t;
    std::string s;
    int line;
    int64_t i = 0;
    double f = 0;
};

struct Lexer {
    std::string src;
    std::string where;
    size_t pos = 0;
    int line = 1;
    std::vector<Tok> out;

    [[noreturn]] void error(int at, const std::string &msg) const {
        throw Error(where + " line " + std::to_string(at) + ": " + msg);
    }

    void advance_to(size_t p) {
        for (; pos < p; ++pos)
            if (src[pos] == '\n') ++line;
    }
    bool starts(const char *s) const { return src.compare(pos, std::strlen(s), s) == 0; }

    void skip_ws_after_tag() {
        while (pos < src.size() && std::isspace(static_cast<unsigned char>(src[pos])))
            advance_to(pos + 1);
    }

    void run() {
        // Jinja's preprocessing: universal newlines, one trailing newline dropped.
        std::string norm;
        for (size_t k = 0; k < src.size(); ++k) {
            if (src[k] == '\r') {
                norm += '\n';
                if (k + 1 < src.size() && src[k + 1] == '\n') ++k;
            } else
                norm += src[k];
        }
        src = std::move(norm);
        if (!src.empty() && src.back() == '\n') src.pop_back();

        bool line_starting = true;
        while (pos < src.size()) {
            size_t k = pos;
            for (;; ++k) {
                k = src.find('{', k);
                if (k == std::string::npos || k + 1 >= src.size()) {
                    k = std::string::npos;
                    break;
                }
                const char n = src[k + 1];
                if (n == '{' || n == '%' || n == '#') break;
            }
            if (k == std::string::npos) {
                out.push_back({T::Text, src.substr(pos), line});
                advance_to(src.size());
                break;
            }
            const char kind = src[k + 1];
            char sign = k + 2 < src.size() ? src[k + 2] : '\0';
            if (sign == '+' && kind == '{') sign = '\0'; // no '+' modifier on {{ }}
            std::string text = src.substr(pos, k - pos);
            if (sign == '-') {
                size_t e = text.size();
                while (e > 0 && std::isspace(static_cast<unsigned char>(text[e - 1]))) --e;
                text.resize(e);
            } else if (sign != '+' && kind != '{') {
                // lstrip_blocks: white space between a line start and a block tag.
                const size_t nl = text.rfind('\n');
                const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
                if (l_pos > 0 || line_starting) {
                    bool only_ws = true;
                    for (size_t q = l_pos; q < text.size(); ++q)
                        only_ws = only_ws && std::isspace(static_cast<unsigned char>(text[q]));
                    if (only_ws) text.resize(l_pos);
                }
            }
            const int text_line = line;
            if (!text.empty()) out.push_back({T::Text, text, text_line});
            advance_to(k);
            const int tag_line = line;
            advance_to(k + 2 + ((sign == '-' || sign == '+') ? 1 : 0));
            if (kind == '#') {
                const size_t e = src.find("#}", pos);
                if (e == std::string::npos) error(tag_line, "comment '{#' is never closed");
                const char before = e > pos ? src[e - 1] : '\0';
                advance_to(e + 2);
                if (before == '-')
                    skip_ws_after_tag();
                else if (before != '+' && pos < src.size() && src[pos] == '\n')
                    advance_to(pos + 1);
                line_starting = pos > 0 && src[pos - 1] == '\n';
                continue;
            }
            out.push_back({kind == '{' ? T::VarBegin : T::BlockBegin, "", tag_line});
            lex_tag(kind == '{', tag_line);
            line_starting = pos > 0 && src[pos - 1] == '\n';
        }
        out.push_back({T::End, "", line});
    }

    void lex_tag(bool var, int tag_line) {
        std::vector<char> stack;
        const char *close = var ? "}}" : "%}";
        while (true) {
            while (pos < src.size() && std::isspace(static_cast<unsigned char>(src[pos])))
                advance_to(pos + 1);
            if (pos >= src.size())
                error(tag_line, std::string("tag '") + (var ? "{{" : "{%") + "' is never closed");
            if (stack.empty()) {
                const bool minus = src[pos] == '-' && src.compare(pos + 1, 2, close) == 0;
                const bool plus = !var && src[pos] == '+' && src.compare(pos + 1, 2, close) == 0;
                if (minus || plus || src.compare(pos, 2, close) == 0) {
                    out.push_back({var ? T::VarEnd : T::BlockEnd, "", line});
                    advance_to(pos + (minus || plus ? 3 : 2));
                    if (minus)
                        skip_ws_after_tag();
                    else if (!var && !plus && pos < src.size() && src[pos] == '\n')
                        advance_to(pos + 1); // trim_blocks
                    return;
                }
            }
            const char c = src[pos];
            const int at = line;
            if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
                size_t e = pos;
                while (e < src.size() &&
                       (std::isalnum(static_cast<unsigned char>(src[e])) || src[e] == '_'))
                    ++e;
                out.push_back({T::Name, src.substr(pos, e - pos), at});
                advance_to(e);
            } else if (std::isdigit(static_cast<unsigned char>(c))) {
                size_t e = pos;
                bool is_float = false;
                while (e < src.size() &&
                       (std::isdigit(static_cast<unsigned char>(src[e])) || src[e] == '_'))
                    ++e;
                if (e + 1 < src.size() && src[e] == '.' &&
                    std::isdigit(static_cast<unsigned char>(src[e + 1]))) {
                    is_float = true;
                    ++e;
                    while (e < src.size() &&
                           (std::isdigit(static_cast<unsigned char>(src[e])) || src[e] == '_'))
                        ++e;
                }
                if (e < src.size() && (src[e] == 'e' || src[e] == 'E')) {
                    size_t q = e + 1;
                    if (q < src.size() && (src[q] == '+' || src[q] == '-')) ++q;
                    if (q < src.size() && std::isdigit(static_cast<unsigned char>(src[q]))) {
                        is_float = true;
                        e = q;
                        while (e < src.size() && std::isdigit(static_cast<unsigned char>(src[e])))
                            ++e;
                    }
                }
                std::string num;
                for (size_t q = pos; q < e; ++q)
                    if (src[q] != '_') num += src[q];
                Tok t{is_float ? T::Float : T::Int, num, at};
                if (is_float) {
                    t.f = std::strtod(num.c_str(), nullptr);
                } else {
                    errno = 0;
                    t.i = std::strtoll(num.c_str(), nullptr, 10);
                    if (errno == ERANGE)
                        error(at,
                              "unsupported: integer literal " + num + " does not fit in 64 bits");
                }
                out.push_back(t);
                advance_to(e);
            } else if (c == '\'' || c == '"') {
                std::string val;
                size_t e = pos + 1;
                while (true) {
                    if (e >= src.size()) error(at, "string literal is never closed");
                    const char ch = src[e];
                    if (ch == c) break;
                    if (ch == '\\' && e + 1 < src.size()) {
                        const char x = src[e + 1];
                        e += 2;
                        switch (x) {
                            case 'n':
                                val += '\n';
                                break;
                            case 't':
                                val += '\t';
                                break;
                            case 'r':
                                val += '\r';
                                break;
                            case '0':
                                val += '\0';
                                break;
                            case 'b':
                                val += '\b';
                                break;
                            case 'f':
                                val += '\f';
                                break;
                            case 'v':
                                val += '\v';
                                break;
                            case 'a':
                                val += '\a';
                                break;
                            case '\\':
                                val += '\\';
                                break;
                            case '\'':
                                val += '\'';
                                break;
                            case '"':
                                val += '"';
                                break;
                            case '\n':
                                break;
                            case 'x':
                            case 'u':
                            case 'U': {
                                const size_t n = x == 'x' ? 2 : x == 'u' ? 4 : 8;
                                if (e + n > src.size())
                                    error(at, "truncated \\" + std::string(1, x) + " escape");
                                const std::string hex = src.substr(e, n);
                                for (char h : hex)
                                    if (!std::isxdigit(static_cast<unsigned char>(h)))
                                        error(at, "invalid \\" + std::string(1, x) + " escape");
                                val += unicode::encode(
                                    static_cast<uint32_t>(std::strtoul(hex.c_str(), nullptr, 16)));
                                e += n;
                                break;
                            }
                            default:
                                val += '\\';
                                val += x;
                        }
                        continue;
                    }
                    val += ch;
                    ++e;
                }
                out.push_back({T::Str, val, at});
                advance_to(e + 1);
            } else {
                static const char *ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                            "/",  "%",  "~",  "<",  ">",  "=",  "(", ")", "[",
                                            "]",  "{",  "}",  ",",  ".",  ":",  "|", ";"};
                const char *found = nullptr;
                for (const char *op : ops)
                    if (starts(op)) {
                        found = op;
                        break;
                    }
                if (!found) error(at, std::string("unexpected character '") + c + "'");
                const std::string op = found;
                if (op == "(" || op == "[" || op == "{") stack.push_back(op[0]);
                if (op == ")" || op == "]" || op == "}") {
                    const char want = op == ")" ? '(' : op == "]" ? '[' : '{';
                    if (stack.empty() || stack.back() != want) error(at, "unexpected '" + op + "'");
                    stack.pop_back();
                }
                out.push_back({T::Op, op, at});
                advance_to(pos + op.size());
            }
        }
    }
};

// ---------------------------------------------------------------------------
// Syntax tree

struct Expr;
using ExprP = std::unique_ptr<Expr>;

struct Expr {
    enum K {
        Lit,
        Name,
        ListE,
        DictE,
        Attr,
        Item,
        Slice,
        Call,
        Filter,
        Test,
        Neg,
        Pos,
        Not,
        Bin,
        Cmp,
        And,
        Or,
        Cond
    } k;
    int line = 0;
    Value lit;
    std::string name;
    std::vector<ExprP> a;
    std::vector<std::pair<std::string, ExprP>> kw;
    std::vector<std::string> ops;
    bool negated = false;
    int depth = 1; // of the tree under this node (Parser::sealed)

    Expr() = default;
    Expr(const Expr &) = delete;
    Expr &operator=(const Expr &) = delete;
    // Frees the subtree through a list rather than recursively: no tree,
    // however deep, can overflow the stack when it goes.
    ~Expr() {
        std::vector<ExprP> pending;
        auto take = [&pending](Expr &e) {
            for (auto &c : e.a)
                if (c) pending.push_back(std::move(c));
            for (auto &kv : e.kw)
                if (kv.second) pending.push_back(std::move(kv.second));
        };
        take(*this);
        while (!pending.empty()) {
            ExprP x = std::move(pending.back());
            pending.pop_back();
            take(*x);
        }
    }
};

struct Node;
using NodeP = std::unique_ptr<Node>;
using Body = std::vector<NodeP>;

struct Node {
    enum K { Text, Out, If, For, Set, SetBlock, Macro, Break, Continue, FilterBlock, Block } k;
    int line = 0;
    std::string text;
    ExprP e;
    std::vector<std::pair<ExprP, Body>> branches;
    Body body, else_body;
    std::vector<std::string> targets;
    bool attr_target = false;
    ExprP filter;
    std::vector<ExprP> defaults;
};

const std::set<std::string> kFilters = {
    "abs",     "capitalize", "count",  "d",      "default",    "dictsort", "first",
    "float",   "indent",     "int",    "items",  "join",       "last",     "length",
    "list",    "lower",      "map",    "max",    "min",        "reject",   "rejectattr",
    "replace", "reverse",    "safe",   "select", "selectattr", "sort",     "string",
    "sum",     "title",      "tojson", "trim",   "unique",     "upper",    "wordcount"};

const std::set<std::string> kTests = {
    "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "escaped", "even", "false",
    "float", "ge", "gt", "in", "integer", "iterable", "le", "lower", "lt", "mapping", "ne", "none",
    "number", "odd", "sameas", "sequence", "string", "true", "undefined", "upper",
    // the comparison operators as test names (`x is >= 3`)
    "==", "!=", "<", "<=", ">", ">="};

// ---------------------------------------------------------------------------
// Parser

struct Parser {
    std::vector<Tok> toks;
    std::string where;
    size_t p = 0;
    int loop_depth = 0;
    int nesting = 0;

    // Bounds recursion on hostile input (the stack, not Jinja, is the limit).
    struct Nest {
        Parser *ps;
        explicit Nest(Parser *x) : ps(x) {
            if (++ps->nesting > kMaxNesting)
                ps->error(ps->peek().line, "unsupported: nesting deeper than " +
                                               std::to_string(kMaxNesting) + " levels");
        }
        ~Nest() { --ps->nesting; }
    };

    [[noreturn]] void error(int line, const std::string &msg) const {
        throw Error(where + " line " + std::to_string(line) + ": " + msg);
    }
    const Tok &peek(size_t ahead = 0) const { return toks[std::min(p + ahead, toks.size() - 1)]; }
    Tok next() { return toks[std::min(p++, toks.size() - 1)]; }
    bool is_op(const char *op, size_t ahead = 0) const {
        return peek(ahead).t == T::Op && peek(ahead).s == op;
    }
    bool is_name(const char *n, size_t ahead = 0) const {
        return peek(ahead).t == T::Name && peek(ahead).s == n;
    }
    // At a comparison operator (also a test name: `x is >= 3`).
    bool at_compare_op() const {
        for (const char *op : {"==", "!=", "<", ">", "<=", ">="})
            if (is_op(op)) return true;
        return false;
    }
    std::string describe(const Tok &t) const {
        switch (t.t) {
            case T::BlockEnd:
                return "end of tag '%}'";
            case T::VarEnd:
                return "end of expression '}}'";
            case T::End:
                return "end of template";
            case T::Str:
                return "string literal";
            default:
                return "'" + t.s + "'";
        }
    }
    void expect_op(const char *op) {
        if (!is_op(op))
            error(peek().line, std::string("expected '") + op + "', got " + describe(peek()));
        ++p;
    }
    void expect_end() {
        if (peek().t != T::BlockEnd)
            error(peek().line, "expected end of tag '%}', got " + describe(peek()));
        ++p;
    }
    std::string expect_name() {
        if (peek().t != T::Name) error(peek().line, "expected a name, got " + describe(peek()));
        return next().s;
    }

    ExprP mk(Expr::K k, int line) {
        auto e = std::make_unique<Expr>();
        e->k = k;
        e->line = line;
        return e;
    }

    // `e` with its children in place: records the depth of its tree, refused
    // past kMaxExprDepth (the evaluator recurses that deep). Chains (`a+b+c`,
    // `x|f|g`, `a.b.c`, `f()()`) are parsed in a loop but nest, so this is the
    // bound on them, applied as each link is added.
    ExprP sealed(ExprP e) {
        int d = 0;
        for (const auto &c : e->a)
            if (c) d = std::max(d, c->depth);
        for (const auto &kv : e->kw)
            if (kv.second) d = std::max(d, kv.second->depth);
        e->depth = d + 1;
        if (e->depth > kMaxExprDepth)
            error(e->line, "unsupported: an expression nested deeper than " +
                               std::to_string(kMaxExprDepth) +
                               " levels (each operator, filter, test, call, attribute and "
                               "subscript in a chain counts one)");
        return e;
    }

    // ---- statements
    Body parse_body(const std::set<std::string> &ends, std::string *found, int open_line,
                    const std::string &open_tag) {
        Body body;
        while (true) {
            const Tok &t = peek();
            if (t.t == T::End) {
                if (!ends.empty())
                    error(open_line, "'{% " + open_tag + " %}' is never closed (expected '{% " +
                                         *ends.rbegin() + " %}')");
                return body;
            }
            if (t.t == T::Text) {
                auto n = std::make_unique<Node>();
                n->k = Node::Text;
                n->line = t.line;
                n->text = t.s;
                body.push_back(std::move(n));
                ++p;
                continue;
            }
            if (t.t == T::VarBegin) {
                ++p;
                auto n = std::make_unique<Node>();
                n->k = Node::Out;
                n->line = t.line;
                n->e = parse_tuple();
                if (peek().t != T::VarEnd)
                    error(peek().line, "expected end of expression '}}', got " + describe(peek()));
                ++p;
                body.push_back(std::move(n));
                continue;
            }
            if (t.t != T::BlockBegin) error(t.line, "unexpected " + describe(t));
            const Tok &tag = peek(1);
            if (tag.t != T::Name) error(tag.line, "expected a tag name after '{%'");
            if (ends.count(tag.s)) {
                *found = tag.s;
                p += 2;
                return body;
            }
            body.push_back(parse_statement());
        }
    }

    NodeP parse_statement() {
        Nest guard(this);
        const int line = peek().line;
        ++p; // {%
        const std::string tag = next().s;
        auto n = std::make_unique<Node>();
        n->line = line;
        std::string found;
        if (tag == "if") {
            n->k = Node::If;
            ExprP cond = parse_expression();
            expect_end();
            while (true) {
                Body b = parse_body({"elif", "else", "endif"}, &found, line, "if");
                n->branches.emplace_back(std::move(cond), std::move(b));
                if (found == "elif") {
                    cond = parse_expression();
                    expect_end();
                    continue;
                }
                if (found == "else") {
                    expect_end();
                    n->else_body = parse_body({"endif"}, &found, line, "if");
                }
                expect_end();
                break;
            }
        } else if (tag == "for") {
            n->k = Node::For;
            const bool paren = is_op("(");
            if (paren) ++p;
            n->targets.push_back(expect_name());
            while (is_op(",")) {
                ++p;
                n->targets.push_back(expect_name());
            }
            if (paren) expect_op(")");
            if (!is_name("in")) error(peek().line, "expected 'in' in '{% for %}'");
            ++p;
            n->e = parse_expression(/*no_cond=*/true);
            if (is_name("if")) {
                ++p;
                n->filter = parse_expression();
            }
            if (is_name("recursive")) error(peek().line, "unsupported: recursive for loops");
            expect_end();
            ++loop_depth;
            n->body = parse_body({"else", "endfor"}, &found, line, "for");
            --loop_depth;
            if (found == "else") {
                expect_end();
                n->else_body = parse_body({"endfor"}, &found, line, "for");
            }
            expect_end();
        } else if (tag == "set") {
            n->targets.push_back(expect_name());
            if (is_op(".")) {
                ++p;
                n->targets.push_back(expect_name());
                n->attr_target = true;
            } else {
                while (is_op(",")) {
                    ++p;
                    n->targets.push_back(expect_name());
                }
            }
            if (is_op("=")) {
                ++p;
                n->k = Node::Set;
                n->e = parse_tuple();
                expect_end();
            } else {
                if (n->attr_target || n->targets.size() != 1)
                    error(line, "a block '{% set %}' assigns one name");
                if (is_op("|")) error(line, "unsupported: filters on a block '{% set %}'");
                expect_end();
                n->k = Node::SetBlock;
                n->body = parse_body({"endset"}, &found, line, "set");
                expect_end();
            }
        } else if (tag == "macro") {
            n->k = Node::Macro;
            n->text = expect_name();
            expect_op("(");
            while (!is_op(")")) {
                n->targets.push_back(expect_name());
                if (is_op("=")) {
                    ++p;
                    n->defaults.push_back(parse_expression());
                } else {
                    if (std::any_of(n->defaults.begin(), n->defaults.end(),
                                    [](const ExprP &d) { return d != nullptr; }))
                        error(line,
                              "macro '" + n->text +
                                  "': a parameter without default follows one with a default");
                    n->defaults.push_back(nullptr);
                }
                if (!is_op(",")) break;
                ++p;
            }
            expect_op(")");
            expect_end();
            const int saved = loop_depth;
            loop_depth = 0;
            n->body = parse_body({"endmacro"}, &found, line, "macro");
            loop_depth = saved;
            if (peek().t == T::Name) ++p; // {% endmacro name %}
            expect_end();
        } else if (tag == "break" || tag == "continue") {
            if (loop_depth == 0) error(line, "'{% " + tag + " %}' outside of a loop");
            n->k = tag == "break" ? Node::Break : Node::Continue;
            expect_end();
        } else if (tag == "filter") {
            n->k = Node::FilterBlock;
            n->filter = parse_filter(nullptr);
            while (is_op("|")) n->filter = parse_filter(std::move(n->filter));
            expect_end();
            n->body = parse_body({"endfilter"}, &found, line, "filter");
            expect_end();
        } else if (tag == "generation") {
            // transformers' AssistantTracker: marks assistant text; renders the body.
            n->k = Node::Block;
            expect_end();
            n->body = parse_body({"endgeneration"}, &found, line, "generation");
            expect_end();
        } else if (tag == "elif" || tag == "else" || tag.rfind("end", 0) == 0) {
            error(line, "unexpected '{% " + tag + " %}'");
        } else {
            error(line, "unsupported tag '{% " + tag + " %}'");
        }
        return n;
    }

    // ---- expressions
    ExprP parse_tuple() {
        const int line = peek().line;
        ExprP e = parse_expression();
        if (!is_op(",")) return e;
        auto t = mk(Expr::ListE, line);
        t->a.push_back(std::move(e));
        while (is_op(",")) {
            ++p;
            if (peek().t == T::VarEnd || peek().t == T::BlockEnd) break;
            t->a.push_back(parse_expression());
        }
        return sealed(std::move(t));
    }

    ExprP parse_expression(bool no_cond = false) {
        Nest guard(this); // `a if b else c if d else ...` recurses here
        if (no_cond) return parse_or();
        ExprP e = parse_or();
        while (is_name("if")) {
            const int line = peek().line;
            ++p;
            auto c = mk(Expr::Cond, line);
            c->a.push_back(std::move(e));
            c->a.push_back(parse_or());
            if (is_name("else")) {
                ++p;
                c->a.push_back(parse_expression());
            } else
                c->a.push_back(nullptr);
            e = sealed(std::move(c));
        }
        return e;
    }

    ExprP binary(Expr::K k, ExprP l, ExprP r, int line, std::string op = {}) {
        auto e = mk(k, line);
        e->name = std::move(op);
        e->a.push_back(std::move(l));
        e->a.push_back(std::move(r));
        return sealed(std::move(e));
    }

    // One precedence level, left-associative: operand (op operand)*, where op
    // is the keyword `word` (each folded into a node of kind k) ...
    template <class Operand>
    ExprP word_chain(const char *word, Expr::K k, Operand operand) {
        ExprP e = operand();
        while (is_name(word)) {
            const int line = next().line;
            e = binary(k, std::move(e), operand(), line);
        }
        return e;
    }
    // ... or one of the operators `ops` (each folded into a Bin node named by it).
    template <class Operand>
    ExprP op_chain(std::initializer_list<const char *> ops, Operand operand) {
        ExprP e = operand();
        while (std::any_of(ops.begin(), ops.end(), [&](const char *op) { return is_op(op); })) {
            const Tok t = next();
            e = binary(Expr::Bin, std::move(e), operand(), t.line, t.s);
        }
        return e;
    }

    ExprP parse_or() {
        return word_chain("or", Expr::Or, [this] { return parse_and(); });
    }
    ExprP parse_and() {
        return word_chain("and", Expr::And, [this] { return parse_not(); });
    }
    ExprP parse_not() {
        Nest guard(this);
        if (is_name("not")) {
            auto e = mk(Expr::Not, next().line);
            e->a.push_back(parse_not());
            return sealed(std::move(e));
        }
        return parse_compare();
    }
    ExprP parse_compare() {
        const int line = peek().line;
        ExprP first = parse_math1();
        ExprP cmp;
        while (true) {
            std::string op;
            if (at_compare_op()) {
                op = next().s;
            } else if (is_name("in")) {
                ++p;
                op = "in";
            } else if (is_name("not") && is_name("in", 1)) {
                p += 2;
                op = "notin";
            } else
                break;
            if (!cmp) {
                cmp = mk(Expr::Cmp, line);
                cmp->a.push_back(std::move(first));
            }
            cmp->ops.push_back(op);
            cmp->a.push_back(parse_math1());
        }
        return cmp ? sealed(std::move(cmp)) : std::move(first);
    }
    ExprP parse_math1() {
        return op_chain({"+", "-"}, [this] { return parse_concat(); });
    }
    ExprP parse_concat() {
        return op_chain({"~"}, [this] { return parse_math2(); });
    }
    ExprP parse_math2() {
        return op_chain({"*", "/", "//", "%"}, [this] { return parse_pow(); });
    }
    ExprP parse_pow() {
        return op_chain({"**"}, [this] { return parse_unary(); });
    }
    ExprP parse_unary(bool with_filter = true) {
        Nest guard(this);
        ExprP e;
        if (is_op("-") || is_op("+")) {
            const Tok t = next();
            e = mk(t.s == "-" ? Expr::Neg : Expr::Pos, t.line);
            e->a.push_back(parse_unary(false));
            e = sealed(std::move(e));
        } else {
            e = parse_primary();
        }
        e = parse_postfix(std::move(e));
        if (with_filter) e = parse_filter_expr(std::move(e));
        return e;
    }

    ExprP parse_primary() {
        const Tok t = next();
        auto lit = [&](Value v) {
            auto e = mk(Expr::Lit, t.line);
            e->lit = std::move(v);
            return e;
        };
        switch (t.t) {
            case T::Name:
                if (t.s == "true" || t.s == "True") return lit(Value::boolean(true));
                if (t.s == "false" || t.s == "False") return lit(Value::boolean(false));
                if (t.s == "none" || t.s == "None") return lit(Value::none());
                {
                    auto e = mk(Expr::Name, t.line);
                    e->name = t.s;
                    return e;
                }
            case T::Str: {
                std::string s = t.s;
                while (peek().t == T::Str) s += next().s;
                return lit(Value::raw_str(s));
            }
            case T::Int:
                return lit(Value::integer(t.i));
            case T::Float:
                return lit(Value::real(t.f));
            case T::Op:
                if (t.s == "(") {
                    if (is_op(")")) {
                        ++p;
                        return mk(Expr::ListE, t.line);
                    }
                    ExprP e = parse_expression();
                    if (is_op(",")) {
                        auto tu = mk(Expr::ListE, t.line);
                        tu->a.push_back(std::move(e));
                        while (is_op(",")) {
                            ++p;
                            if (is_op(")")) break;
                            tu->a.push_back(parse_expression());
                        }
                        e = sealed(std::move(tu));
                    }
                    expect_op(")");
                    return e;
                }
                if (t.s == "[") {
                    auto e = mk(Expr::ListE, t.line);
                    comma_list("]", [&] { e->a.push_back(parse_expression()); });
                    return sealed(std::move(e));
                }
                if (t.s == "{") {
                    auto e = mk(Expr::DictE, t.line);
                    comma_list("}", [&] {
                        e->a.push_back(parse_expression());
                        expect_op(":");
                        e->a.push_back(parse_expression());
                    });
                    return sealed(std::move(e));
                }
                break;
            default:
                break;
        }
        error(t.line, "unexpected " + describe(t) + " in an expression");
    }

    // callee(args...), at '('.
    ExprP parse_call(ExprP callee) {
        auto c = mk(Expr::Call, peek().line);
        c->a.push_back(std::move(callee));
        parse_call_args(*c);
        return sealed(std::move(c));
    }

    // Items separated by ',' (a trailing one allowed), each read by item(), up
    // to and including `close`.
    template <class Item>
    void comma_list(const char *close, Item item) {
        while (!is_op(close)) {
            item();
            if (!is_op(",")) break;
            ++p;
        }
        expect_op(close);
    }

    void parse_call_args(Expr &call) {
        expect_op("(");
        comma_list(")", [&] {
            if (is_op("*") || is_op("**"))
                error(peek().line, "unsupported: *args / **kwargs in a call");
            if (peek().t == T::Name && is_op("=", 1)) {
                std::string k = next().s;
                ++p;
                call.kw.emplace_back(std::move(k), parse_expression());
            } else {
                if (!call.kw.empty())
                    error(peek().line, "positional argument follows keyword argument");
                call.a.push_back(parse_expression());
            }
        });
    }

    ExprP parse_postfix(ExprP e) {
        while (true) {
            if (is_op(".")) {
                const int line = next().line;
                if (peek().t == T::Int) {
                    auto it = mk(Expr::Item, line);
                    it->a.push_back(std::move(e));
                    auto idx = mk(Expr::Lit, line);
                    idx->lit = Value::integer(next().i);
                    it->a.push_back(std::move(idx));
                    e = sealed(std::move(it));
                } else {
                    auto at = mk(Expr::Attr, line);
                    at->name = expect_name();
                    at->a.push_back(std::move(e));
                    e = sealed(std::move(at));
                }
            } else if (is_op("[")) {
                const int line = next().line;
                ExprP parts[3];
                int colons = 0;
                if (!is_op(":")) parts[0] = parse_expression();
                while (is_op(":") && colons < 2) {
                    ++p;
                    ++colons;
                    if (!is_op(":") && !is_op("]")) parts[colons] = parse_expression();
                }
                expect_op("]");
                if (colons == 0) {
                    auto it = mk(Expr::Item, line);
                    it->a.push_back(std::move(e));
                    it->a.push_back(std::move(parts[0]));
                    e = sealed(std::move(it));
                } else {
                    auto sl = mk(Expr::Slice, line);
                    sl->a.push_back(std::move(e));
                    for (auto &x : parts) sl->a.push_back(std::move(x));
                    e = sealed(std::move(sl));
                }
            } else if (is_op("(")) {
                e = parse_call(std::move(e));
            } else
                return e;
        }
    }

    ExprP parse_filter(ExprP obj) {
        // at '|' (or, for {% filter %}, at the name)
        if (is_op("|")) ++p;
        const int line = peek().line;
        std::string name = expect_name();
        while (is_op(".")) {
            ++p;
            name += "." + expect_name();
        }
        if (!kFilters.count(name)) error(line, "unsupported filter '" + name + "'");
        auto f = mk(Expr::Filter, line);
        f->name = name;
        f->a.push_back(std::move(obj));
        if (is_op("(")) parse_call_args(*f);
        return sealed(std::move(f));
    }

    ExprP parse_filter_expr(ExprP e) {
        while (true) {
            if (is_op("|")) {
                e = parse_filter(std::move(e));
            } else if (is_name("is")) {
                const int line = next().line;
                auto t = mk(Expr::Test, line);
                if (is_name("not")) {
                    ++p;
                    t->negated = true;
                }
                if (peek().t == T::Name || at_compare_op())
                    t->name = next().s;
                else
                    error(line, "expected a test name after 'is'");
                if (!kTests.count(t->name)) error(line, "unsupported test '" + t->name + "'");
                t->a.push_back(std::move(e));
                if (is_op("(")) {
                    parse_call_args(*t);
                } else if ((peek().t == T::Name || peek().t == T::Str || peek().t == T::Int ||
                            peek().t == T::Float || is_op("[") || is_op("{")) &&
                           !is_name("else") && !is_name("or") && !is_name("and")) {
                    ExprP arg = parse_primary();
                    t->a.push_back(parse_postfix(std::move(arg)));
                }
                e = sealed(std::move(t));
            } else if (is_op("(")) {
                e = parse_call(std::move(e));
            } else
                return e;
        }
    }
};

// ---------------------------------------------------------------------------
// Evaluator

enum class Flow { Next, Break, Continue };

using Frame = std::unordered_map<std::string, Value>;

struct Evaluator {
    std::vector<std::shared_ptr<Frame>> frames;
    RenderOptions options;
    int depth = 0;             // macro calls nested
    int recursion = 0;         // evaluation frames nested (kMaxRecursion)
    uintptr_t stack_floor = 0; // the lowest stack address frames may use

    // One nested evaluation frame; refused past kMaxRecursion, or past the
    // stack the render may use (frames are larger in debug and sanitizer builds).
    struct Frame_ {
        Evaluator *ev;
        explicit Frame_(Evaluator *e) : ev(e) {
            const auto here = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
            const bool deep_stack = here < ev->stack_floor;
            if (++ev->recursion > kMaxRecursion || deep_stack) {
                --ev->recursion;
                fail("the template recurses too deep (over " +
                     (deep_stack ? mib(kMaxStackBytes) + " of stack"
                                 : std::to_string(kMaxRecursion) + " nested evaluations") +
                     ": macro calls, filters and expressions nested in each other)");
            }
        }
        ~Frame_() { --ev->recursion; }
        Frame_(const Frame_ &) = delete;
        Frame_ &operator=(const Frame_ &) = delete;
    };

    const Value *lookup(const std::string &name) const {
        for (auto it = frames.rbegin(); it != frames.rend(); ++it) {
            auto f = (*it)->find(name);
            if (f != (*it)->end()) return &f->second;
        }
        return nullptr;
    }
    void assign(const std::string &name, Value v) { (*frames.back())[name] = std::move(v); }

    // ---- expressions
    Value eval(const Expr &e) {
        try {
            Frame_ guard(this);
            charge(1);
            return eval_inner(e);
        } catch (JError &err) {
            if (err.line == 0) err.line = e.line;
            throw;
        }
    }

    Args eval_args(const Expr &e, size_t from) {
        Args args;
        for (size_t i = from; i < e.a.size(); ++i) args.pos.push_back(eval(*e.a[i]));
        for (const auto &kv : e.kw) args.kw.emplace_back(kv.first, eval(*kv.second));
        return args;
    }

    Value get_attr(const Value &obj, const std::string &name) {
        switch (obj.k) {
            case Value::Undefined:
                fail_undefined(obj);
            case Value::DictK: {
                if (const Value *v = obj.d->find(name)) return *v;
                return Value::undefined(std::string("'") + type_name(obj) +
                                        " object' has no attribute '" + name + "'");
            }
            default:
                return Value::undefined(std::string("'") + type_name(obj) +
                                        " object' has no attribute '" + name + "'");
        }
    }

    Value get_item(const Value &obj, const Value &key) {
        switch (obj.k) {
            case Value::Undefined:
                fail_undefined(obj);
            case Value::DictK:
                if (key.k == Value::Str) {
                    if (const Value *v = obj.d->find(key.s)) return *v;
                }
                return Value::undefined(std::string("'") + type_name(obj) +
                                        " object' has no attribute " + py_repr(key));
            case Value::ListK:
            case Value::Str: {
                if (obj.generator) fail("'generator' object is not subscriptable");
                if (!is_intlike(key)) {
                    if (key.k == Value::Str) return get_attr(obj, key.s);
                    fail(std::string(type_name(obj)) + " indices must be integers, not " +
                         type_name(key));
                }
                int64_t i = as_int(key);
                if (obj.k == Value::ListK) {
                    const int64_t n = static_cast<int64_t>(obj.l->size());
                    if (i < 0) i += n;
                    if (i < 0 || i >= n)
                        return Value::undefined("list index " + std::to_string(as_int(key)) +
                                                " out of range");
                    return (*obj.l)[static_cast<size_t>(i)];
                }
                const auto cs = chars_of(obj.s);
                const int64_t n = static_cast<int64_t>(cs.size());
                if (i < 0) i += n;
                if (i < 0 || i >= n)
                    return Value::undefined("string index " + std::to_string(as_int(key)) +
                                            " out of range");
                return Value::str(cs[static_cast<size_t>(i)]);
            }
            default:
                return Value::undefined(std::string("'") + type_name(obj) +
                                        " object' has no item " + py_repr(key));
        }
    }

    Value binop(const std::string &op, const Value &l, const Value &r) {
        if (op == "~") return Value::str(to_str(l) + to_str(r));
        if (l.k == Value::Undefined) fail_undefined(l);
        if (r.k == Value::Undefined) fail_undefined(r);
        auto bad = [&]() -> Value {
            fail("unsupported operand type(s) for " + op + ": '" + type_name(l) + "' and '" +
                 type_name(r) + "'");
        };
        if (op == "+") {
            if (l.k == Value::Str && r.k == Value::Str && (l.markup || r.markup)) {
                // markupsafe: Markup + str escapes the str, and the result is Markup.
                Value out = Value::str((l.markup ? l.s : html_escape(l.s)) +
                                       (r.markup ? r.s : html_escape(r.s)));
                out.markup = true;
                return out;
            }
            if (l.k == Value::Str && r.k == Value::Str) return Value::str(l.s + r.s);
            if (l.k == Value::ListK && r.k == Value::ListK) {
                if (l.l->size() + r.l->size() > kMaxListItems)
                    fail("+: the list would have more than " + std::to_string(kMaxListItems) +
                         " items");
                List out = *l.l;
                out.insert(out.end(), r.l->begin(), r.l->end());
                return Value::list(std::move(out));
            }
        }
        if (op == "*") {
            const Value *s = l.k == Value::Str || l.k == Value::ListK ? &l : &r;
            const Value *n = s == &l ? &r : &l;
            if ((s->k == Value::Str || s->k == Value::ListK) && is_intlike(*n)) {
                if (s->k == Value::ListK && s->generator)
                    fail("unsupported operand type(s) for *: 'generator' and 'int'");
                // An empty unit gives an empty result however many times.
                const bool str = s->k == Value::Str;
                const size_t unit = str ? s->s.size() : s->l->size();
                const uint64_t times =
                    unit == 0 ? 0 : static_cast<uint64_t>(std::max<int64_t>(0, as_int(*n)));
                const size_t cap = str ? kMaxStringBytes : kMaxListItems;
                if (times > cap / std::max<size_t>(unit, 1))
                    fail(std::string("repetition: the result would be longer than ") +
                         (str ? mib(kMaxStringBytes) : std::to_string(kMaxListItems) + " items"));
                if (str) {
                    std::string out;
                    out.reserve(unit * times);
                    for (uint64_t k = 0; k < times; ++k) out += s->s;
                    return Value::str(std::move(out));
                }
                List out;
                out.reserve(unit * times);
                for (uint64_t k = 0; k < times; ++k)
                    out.insert(out.end(), s->l->begin(), s->l->end());
                return Value::list(std::move(out));
            }
        }
        if (op == "%" && l.k == Value::Str) fail("unsupported: '%' string formatting");
        if (!is_number(l) || !is_number(r)) return bad();
        const bool ints = is_intlike(l) && is_intlike(r);
        if (ints && (op == "+" || op == "-" || op == "*")) {
            int64_t out = 0;
            const bool overflow = op == "+"   ? __builtin_add_overflow(as_int(l), as_int(r), &out)
                                  : op == "-" ? __builtin_sub_overflow(as_int(l), as_int(r), &out)
                                              : __builtin_mul_overflow(as_int(l), as_int(r), &out);
            if (overflow) fail("unsupported: integer overflow beyond 64 bits");
            return Value::integer(out);
        }
        if (op == "+") return Value::real(as_double(l) + as_double(r));
        if (op == "-") return Value::real(as_double(l) - as_double(r));
        if (op == "*") return Value::real(as_double(l) * as_double(r));
        if (op == "/") {
            if (as_double(r) == 0) fail("division by zero");
            return Value::real(as_double(l) / as_double(r));
        }
        if (op == "//" || op == "%") {
            if (as_double(r) == 0) fail("integer division or modulo by zero");
            if (ints) {
                const int64_t a = as_int(l), b = as_int(r);
                if (a == INT64_MIN && b == -1) fail("unsupported: integer overflow beyond 64 bits");
                int64_t q = a / b, m = a % b;
                if (m != 0 && ((m < 0) != (b < 0))) {
                    --q;
                    m += b;
                }
                return Value::integer(op == "//" ? q : m);
            }
            const double a = as_double(l), b = as_double(r);
            const double q = std::floor(a / b);
            return Value::real(op == "//" ? q : a - q * b);
        }
        if (op == "**") {
            if (ints && as_int(r) >= 0) {
                // By squaring: 64 steps at most, whatever the exponent.
                int64_t base = as_int(l), out = 1;
                for (int64_t e = as_int(r);;) {
                    if ((e & 1) && __builtin_mul_overflow(out, base, &out))
                        fail("unsupported: integer overflow beyond 64 bits");
                    e >>= 1;
                    if (e == 0) break;
                    // The result takes base^2 at least: its overflow is the result's.
                    if (__builtin_mul_overflow(base, base, &base))
                        fail("unsupported: integer overflow beyond 64 bits");
                }
                return Value::integer(out);
            }
            const double a = as_double(l), b = as_double(r);
            if (a == 0 && b < 0) fail("0.0 cannot be raised to a negative power");
            if (a < 0 && std::isfinite(b) && b != std::floor(b))
                fail("unsupported: a negative number raised to a fractional power (complex)");
            const double out = std::pow(a, b);
            if (std::isinf(out) && std::isfinite(a) && std::isfinite(b))
                fail("** overflows a float (Numerical result out of range)");
            return Value::real(out);
        }
        return bad();
    }

    Value eval_inner(const Expr &e) {
        switch (e.k) {
            case Expr::Lit:
                return e.lit;
            case Expr::Name: {
                if (const Value *v = lookup(e.name)) return *v;
                return Value::undefined("'" + e.name + "' is undefined");
            }
            case Expr::ListE: {
                List l;
                for (const auto &x : e.a) l.push_back(eval(*x));
                return Value::list(std::move(l));
            }
            case Expr::DictE: {
                Value d = Value::dict();
                for (size_t i = 0; i + 1 < e.a.size(); i += 2) {
                    const Value k = eval(*e.a[i]);
                    if (k.k != Value::Str)
                        fail(std::string("unsupported: a dict literal with a non-string key (") +
                             type_name(k) + ")");
                    d.d->set(k.s, eval(*e.a[i + 1]));
                }
                return d;
            }
            case Expr::Attr:
                return get_attr(eval(*e.a[0]), e.name);
            case Expr::Item:
                return get_item(eval(*e.a[0]), eval(*e.a[1]));
            case Expr::Slice: {
                const Value obj = eval(*e.a[0]);
                Value b[3];
                for (int k = 0; k < 3; ++k)
                    if (e.a[1 + k]) b[k] = eval(*e.a[1 + k]);
                if (obj.k == Value::ListK) {
                    if (obj.generator) fail("'generator' object is not subscriptable");
                    List out;
                    for (int64_t i :
                         slice_indices(static_cast<int64_t>(obj.l->size()), b[0], b[1], b[2]))
                        out.push_back((*obj.l)[static_cast<size_t>(i)]);
                    return Value::list(std::move(out));
                }
                if (obj.k == Value::Str) {
                    const auto cs = chars_of(obj.s);
                    std::string out;
                    for (int64_t i :
                         slice_indices(static_cast<int64_t>(cs.size()), b[0], b[1], b[2]))
                        out += cs[static_cast<size_t>(i)];
                    return Value::str(out);
                }
                if (obj.k == Value::Undefined) fail_undefined(obj);
                fail(std::string("'") + type_name(obj) + "' object is not subscriptable");
            }
            case Expr::Call: {
                const Expr &callee = *e.a[0];
                if (callee.k == Expr::Attr) {
                    const Value obj = eval(*callee.a[0]);
                    if (obj.k == Value::Undefined) fail_undefined(obj);
                    if (obj.k == Value::Str || obj.k == Value::ListK ||
                        (obj.k == Value::DictK && !obj.d->is_namespace)) {
                        Args args = eval_args(e, 1);
                        std::optional<Value> r = call_method(obj, callee.name, args);
                        if (r) return *r;
                    }
                    return call(get_attr(obj, callee.name), e, callee.name);
                }
                std::string what = callee.k == Expr::Name ? callee.name : "expression";
                return call(eval(callee), e, what);
            }
            case Expr::Filter: {
                Value obj = eval(*e.a[0]);
                Args args = eval_args(e, 1);
                return apply_filter(e.name, obj, args);
            }
            case Expr::Test: {
                // `x is defined` must not fail on a missing name or attribute.
                Value obj = eval(*e.a[0]);
                Args args = eval_args(e, 1);
                const bool r = apply_test(e.name, obj, args);
                return Value::boolean(e.negated ? !r : r);
            }
            case Expr::Neg:
            case Expr::Pos: {
                const Value v = eval(*e.a[0]);
                if (v.k == Value::Undefined) fail_undefined(v);
                if (!is_number(v))
                    fail(std::string("bad operand type for unary ") +
                         (e.k == Expr::Neg ? "-" : "+") + ": '" + type_name(v) + "'");
                if (e.k == Expr::Pos) return is_intlike(v) ? Value::integer(as_int(v)) : v;
                if (is_intlike(v) && as_int(v) == INT64_MIN)
                    fail("unsupported: integer overflow beyond 64 bits");
                return is_intlike(v) ? Value::integer(-as_int(v)) : Value::real(-v.f);
            }
            case Expr::Not:
                return Value::boolean(!truthy(eval(*e.a[0])));
            case Expr::And: {
                Value l = eval(*e.a[0]);
                if (!truthy(l)) return l;
                return eval(*e.a[1]);
            }
            case Expr::Or: {
                Value l = eval(*e.a[0]);
                if (truthy(l)) return l;
                return eval(*e.a[1]);
            }
            case Expr::Bin:
                return binop(e.name, eval(*e.a[0]), eval(*e.a[1]));
            case Expr::Cmp: {
                Value l = eval(*e.a[0]);
                for (size_t i = 0; i < e.ops.size(); ++i) {
                    Value r = eval(*e.a[i + 1]);
                    const std::string &op = e.ops[i];
                    bool ok;
                    if (op == "==")
                        ok = equal(l, r);
                    else if (op == "!=")
                        ok = !equal(l, r);
                    else if (op == "in")
                        ok = contains(r, l);
                    else if (op == "notin")
                        ok = !contains(r, l);
                    else {
                        const int c = compare(l, r, op.c_str());
                        ok = op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0;
                    }
                    if (!ok) return Value::boolean(false);
                    l = std::move(r);
                }
                return Value::boolean(true);
            }
            case Expr::Cond: {
                if (truthy(eval(*e.a[1]))) return eval(*e.a[0]);
                if (e.a[2]) return eval(*e.a[2]);
                return Value::undefined("the conditional expression had no else branch");
            }
        }
        fail("internal: unknown expression");
    }

    Value call(const Value &f, const Expr &e, const std::string &what) {
        if (f.k == Value::Undefined) {
            if (e.a[0]->k == Expr::Name)
                fail("'" + what + "' is undefined (unsupported function or missing variable)");
            fail_undefined(f);
        }
        if (f.k != Value::Func) fail("'" + what + "' is not callable (" + type_name(f) + ")");
        Args args = eval_args(e, 1);
        return (*f.fn)(args);
    }

    std::optional<Value> call_method(const Value &obj, const std::string &m, Args &args) {
        if (obj.k == Value::Str) {
            const std::string &s = obj.s;
            if (m == "strip" || m == "lstrip" || m == "rstrip") {
                args.expect(m, {"chars"});
                return Value::str(py_strip(s, args.get(0, "chars"), m != "rstrip", m != "lstrip"));
            }
            if (m == "split" || m == "rsplit") {
                args.expect(m, {"sep", "maxsplit"});
                const int64_t maxsplit = int_arg(args.get(1, "maxsplit"), "split() maxsplit", -1);
                if (m == "rsplit" && maxsplit >= 0) fail("unsupported: rsplit() with maxsplit");
                List out;
                for (auto &x : py_split(s, args.get(0, "sep"), maxsplit))
                    out.push_back(Value::str(std::move(x)));
                return Value::list(std::move(out));
            }
            if (m == "startswith" || m == "endswith") {
                args.expect(m, {"prefix"}, 1);
                const Value *a = args.get(0, "prefix");
                std::vector<std::string> cands;
                if (a->k == Value::ListK) {
                    for (const auto &x : *a->l)
                        cands.push_back(str_arg(&x, (m + "() argument").c_str()));
                } else
                    cands.push_back(str_arg(a, (m + "() argument").c_str()));
                for (const auto &c : cands) {
                    if (c.size() > s.size()) continue;
                    if (m == "startswith" ? s.compare(0, c.size(), c) == 0
                                          : s.compare(s.size() - c.size(), c.size(), c) == 0)
                        return Value::boolean(true);
                }
                return Value::boolean(false);
            }
            if (m == "replace") {
                args.expect("replace", {"old", "new", "count"}, 2);
                return Value::str(py_replace(s, str_arg(args.get(0, "old"), "replace() old"),
                                             str_arg(args.get(1, "new"), "replace() new"),
                                             int_arg(args.get(2, "count"), "replace() count", -1)));
            }
            if (m == "upper" || m == "lower") {
                args.expect(m, {});
                return Value::str(map_case(s, m == "upper" ? 1 : 0));
            }
            if (m == "title" || m == "capitalize") {
                args.expect(m, {});
                return Value::str(m == "title" ? title(s) : capitalize(s));
            }
            if (m == "find" || m == "count") {
                args.expect(m, {"sub"}, 1);
                const std::string sub = str_arg(args.get(0, "sub"), (m + "() argument").c_str());
                charge_search(s, sub);
                if (m == "find") {
                    const size_t k = s.find(sub);
                    return Value::integer(
                        k == std::string::npos
                            ? -1
                            : static_cast<int64_t>(chars_of(s.substr(0, k)).size()));
                }
                if (sub.empty()) return Value::integer(length(obj) + 1);
                int64_t n = 0;
                for (size_t k = s.find(sub); k != std::string::npos;
                     k = s.find(sub, k + sub.size()))
                    ++n;
                return Value::integer(n);
            }
            if (m == "format") return Value::str(py_format(s, args));
            if (m == "join") {
                args.expect("join", {"iterable"}, 1);
                std::string out;
                bool first = true;
                for (const auto &x : iterate(*args.get(0, "iterable"))) {
                    if (x.k != Value::Str) fail("join(): sequence item is not a string");
                    if (!first) out += s;
                    out += x.s;
                    check_size(out, "join()");
                    first = false;
                }
                return Value::str(std::move(out));
            }
            if (m == "isdigit" || m == "isspace" || m == "isalpha" || m == "isalnum") {
                args.expect(m, {});
                if (s.empty()) return Value::boolean(false);
                for (const auto &c : chars_of(s)) {
                    const auto cp = static_cast<utf8proc_int32_t>(decode_cp(c));
                    const auto cat = utf8proc_category(cp);
                    bool ok;
                    if (m == "isdigit")
                        ok = cat == UTF8PROC_CATEGORY_ND;
                    else if (m == "isspace")
                        ok = unicode::is_space(static_cast<uint32_t>(cp));
                    else {
                        const bool alpha =
                            cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL ||
                            cat == UTF8PROC_CATEGORY_LT || cat == UTF8PROC_CATEGORY_LM ||
                            cat == UTF8PROC_CATEGORY_LO;
                        ok = alpha || (m == "isalnum" && (cat == UTF8PROC_CATEGORY_ND ||
                                                          cat == UTF8PROC_CATEGORY_NL ||
                                                          cat == UTF8PROC_CATEGORY_NO));
                    }
                    if (!ok) return Value::boolean(false);
                }
                return Value::boolean(true);
            }
            fail("unsupported string method '" + m + "'");
        }
        if (obj.k == Value::DictK) {
            if (m == "items" || m == "keys" || m == "values") {
                args.expect(m, {});
                List out;
                for (const auto &kv : obj.d->items) {
                    if (m == "items")
                        out.push_back(pair(kv.first, kv.second));
                    else
                        out.push_back(m == "keys" ? Value::str(kv.first) : kv.second);
                }
                return Value::list(std::move(out));
            }
            if (m == "get") {
                args.expect("get", {"key", "default"}, 1);
                const Value *k = args.get(0, "key");
                if (k->k == Value::Str)
                    if (const Value *v = obj.d->find(k->s)) return *v;
                const Value *d = args.get(1, "default");
                return d ? *d : Value::none();
            }
            if (m == "pop" || m == "update" || m == "setdefault" || m == "clear" || m == "popitem")
                fail("dict." + m + "() is not allowed (the template sandbox is immutable)");
            if (obj.d->find(m)) return std::nullopt; // a key holding a function
            fail("unsupported dict method '" + m + "'");
        }
        if (obj.k == Value::ListK) {
            if (m == "append" || m == "pop" || m == "extend" || m == "insert" || m == "remove" ||
                m == "clear" || m == "sort" || m == "reverse")
                fail("list." + m + "() is not allowed (the template sandbox is immutable)");
            if (m == "index" || m == "count") {
                args.expect(m, {"x"}, 1);
                const Value *x = args.get(0, "x");
                int64_t n = 0;
                for (size_t i = 0; i < obj.l->size(); ++i)
                    if (equal((*obj.l)[i], *x)) {
                        if (m == "index") return Value::integer(static_cast<int64_t>(i));
                        ++n;
                    }
                if (m == "index") fail("list.index(x): x not in list");
                return Value::integer(n);
            }
            fail("unsupported list method '" + m + "'");
        }
        return std::nullopt;
    }

    // The attribute path `a.b.0` of a value (Jinja's make_attrgetter).
    Value attr_path(const Value &v, const std::string &path) {
        Value cur = v;
        for (const std::string &part : split(path, '.')) {
            const bool digits =
                !part.empty() && part.size() < 19 &&
                std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
            cur = digits ? get_item(cur, Value::integer(std::stoll(part)))
                         : get_item(cur, Value::str(part));
        }
        return cur;
    }

    Value apply_filter(const std::string &name, const Value &v, Args &args) {
        Frame_ guard(this); // map() applies filters within filters
        auto need_str = [&](const Value &x) -> std::string {
            if (x.k == Value::Undefined) return "";
            return to_str(x);
        };
        // The filters that take no argument besides the value.
        static const std::set<std::string> kNoArgs = {
            "safe",      "string", "length", "count", "upper", "lower",   "capitalize", "title",
            "wordcount", "items",  "list",   "first", "last",  "reverse", "abs"};
        if (kNoArgs.count(name)) args.expect(name, {});
        if (name == "safe") {
            Value out = Value::str(to_str(v));
            out.markup = true;
            return out;
        }
        if (name == "string") return Value::str(to_str(v));
        if (name == "trim") {
            args.expect("trim", {"chars"});
            return Value::str(py_strip(need_str(v), args.get(0, "chars"), true, true));
        }
        if (name == "length" || name == "count") return Value::integer(length(v));
        if (name == "upper" || name == "lower")
            return Value::str(map_case(need_str(v), name == "upper"));
        if (name == "capitalize") return Value::str(capitalize(need_str(v)));
        if (name == "title") return Value::str(title(need_str(v)));
        if (name == "wordcount")
            return Value::integer(static_cast<int64_t>(py_split(need_str(v), nullptr, -1).size()));
        if (name == "replace") {
            args.expect("replace", {"old", "new", "count"}, 2);
            return Value::str(py_replace(need_str(v), to_str(*args.get(0, "old")),
                                         to_str(*args.get(1, "new")),
                                         int_arg(args.get(2, "count"), "replace: count", -1)));
        }
        if (name == "default" || name == "d") {
            args.expect("default", {"default_value", "boolean"});
            const Value *dv = args.get(0, "default_value");
            const Value *b = args.get(1, "boolean");
            const bool use = v.k == Value::Undefined || (b && truthy(*b) && !truthy(v));
            if (use) return dv ? *dv : Value::str("");
            return v;
        }
        if (name == "tojson") {
            args.expect("tojson", {"indent", "ensure_ascii", "separators", "sort_keys"});
            JsonStyle st;
            if (const Value *x = args.get(0, "indent"); x && x->k != Value::None) {
                if (is_intlike(*x) && as_int(*x) > 64) fail("tojson: indent larger than 64");
                if (is_intlike(*x))
                    st.indent =
                        std::string(static_cast<size_t>(std::max<int64_t>(0, as_int(*x))), ' ');
                else if (x->k == Value::Str)
                    st.indent = x->s;
                else
                    fail("tojson: indent must be an integer or a string");
                st.item_sep = ",";
            }
            if (const Value *x = args.get(1, "ensure_ascii")) st.ensure_ascii = truthy(*x);
            if (const Value *x = args.get(2, "separators"); x && x->k != Value::None) {
                if (x->k != Value::ListK || x->l->size() != 2 || (*x->l)[0].k != Value::Str ||
                    (*x->l)[1].k != Value::Str)
                    fail("tojson: separators must be a pair of strings");
                st.item_sep = (*x->l)[0].s;
                st.key_sep = (*x->l)[1].s;
            }
            if (const Value *x = args.get(3, "sort_keys")) st.sort_keys = truthy(*x);
            std::string out;
            to_json(v, st, 0, out);
            return Value::str(out);
        }
        if (name == "items") {
            if (v.k == Value::Undefined) return Value::list();
            if (v.k != Value::DictK || v.d->is_namespace)
                fail("items: can only get item pairs from a mapping");
            List out;
            for (const auto &kv : v.d->items) out.push_back(pair(kv.first, kv.second));
            return Value::gen(std::move(out));
        }
        if (name == "dictsort") {
            args.expect("dictsort", {"case_sensitive", "by", "reverse"});
            if (v.k != Value::DictK || v.d->is_namespace) fail("dictsort: value is not a mapping");
            const Value *cs = args.get(0, "case_sensitive");
            const Value *by = args.get(1, "by");
            const Value *rev = args.get(2, "reverse");
            const bool case_sensitive = cs && truthy(*cs);
            const bool by_value = by && by->k == Value::Str && by->s == "value";
            List out;
            for (const auto &kv : v.d->items) out.push_back(pair(kv.first, kv.second));
            auto key = [&](const Value &pair) {
                Value k = (*pair.l)[by_value ? 1 : 0];
                if (!case_sensitive && k.k == Value::Str) k.s = map_case(k.s, 0);
                return k;
            };
            std::stable_sort(out.begin(), out.end(), [&](const Value &a, const Value &b) {
                return compare(key(a), key(b), "<") < 0;
            });
            if (rev && truthy(*rev)) std::reverse(out.begin(), out.end());
            return Value::list(std::move(out));
        }
        if (name == "join") {
            args.expect("join", {"d", "attribute"});
            const Value *sep = args.get(0, "d");
            const Value *attr = args.get(1, "attribute");
            std::string out;
            bool first = true;
            const std::string between = sep ? to_str(*sep) : "";
            for (const auto &x : iterate(v)) {
                if (!first) out += between;
                out += to_str(attr && attr->k != Value::None ? attr_path(x, to_str(*attr)) : x);
                check_size(out, "join");
                first = false;
            }
            return Value::str(std::move(out));
        }
        if (name == "list") return Value::list(iterate(v));
        if (name == "first" || name == "last") {
            if (name == "last" && v.k == Value::ListK && v.generator)
                fail("'generator' object is not reversible");
            const auto items = iterate(v);
            if (items.empty()) return Value::undefined("No first item, sequence was empty.");
            return name == "first" ? items.front() : items.back();
        }
        if (name == "reverse") {
            if (v.k == Value::Str) {
                auto cs = chars_of(v.s);
                std::string out;
                for (auto it = cs.rbegin(); it != cs.rend(); ++it) out += *it;
                return Value::str(out);
            }
            auto items = iterate(v);
            std::reverse(items.begin(), items.end());
            return Value::gen(std::move(items));
        }
        if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
            const bool attr = name == "selectattr" || name == "rejectattr";
            const bool keep_if = name == "select" || name == "selectattr";
            size_t k = 0;
            std::string path;
            if (attr) {
                if (args.pos.empty()) fail(name + ": missing the attribute");
                path = to_str(args.pos[k++]);
            }
            if (!args.kw.empty())
                fail(name + ": unexpected keyword argument '" + args.kw[0].first + "'");
            std::string test;
            if (k < args.pos.size()) test = to_str(args.pos[k++]);
            if (!test.empty() && !kTests.count(test))
                fail(name + ": unsupported test '" + test + "'");
            Args targs;
            targs.pos.assign(args.pos.begin() + static_cast<std::ptrdiff_t>(k), args.pos.end());
            List out;
            if (!truthy(v)) return Value::gen({}); // Jinja: `if seq:` first
            for (const auto &x : iterate(v)) {
                const Value item = attr ? attr_path(x, path) : x;
                const bool r = test.empty() ? truthy(item) : apply_test(test, item, targs);
                if (r == keep_if) out.push_back(x);
            }
            return Value::gen(std::move(out));
        }
        if (name == "map") {
            List out;
            const Value *attr = nullptr;
            const Value *dflt = nullptr;
            for (const auto &kv : args.kw) {
                if (kv.first == "attribute")
                    attr = &kv.second;
                else if (kv.first == "default")
                    dflt = &kv.second;
                else
                    fail("map: unexpected keyword argument '" + kv.first + "'");
            }
            if (attr && !args.pos.empty()) fail("map: a filter name and attribute= together");
            if (!truthy(v)) return Value::gen({}); // Jinja: `if value:` first
            if (attr) {
                for (const auto &x : iterate(v)) {
                    Value r = attr_path(x, to_str(*attr));
                    if (r.k == Value::Undefined && dflt) r = *dflt;
                    out.push_back(r);
                }
                return Value::gen(std::move(out));
            }
            if (args.pos.empty()) fail("map: needs a filter name or attribute=");
            const std::string f = to_str(args.pos[0]);
            if (!kFilters.count(f)) fail("map: unsupported filter '" + f + "'");
            Args fargs;
            fargs.pos.assign(args.pos.begin() + 1, args.pos.end());
            for (const auto &x : iterate(v)) {
                Args copy = fargs;
                out.push_back(apply_filter(f, x, copy));
            }
            return Value::gen(std::move(out));
        }
        if (name == "unique" || name == "sort" || name == "min" || name == "max") {
            const Value *cs = nullptr;
            const Value *attr = nullptr;
            const Value *rev = nullptr;
            for (size_t i = 0; i < args.pos.size(); ++i) {
                if (name == "sort" && i == 0)
                    rev = &args.pos[i];
                else if ((name == "sort" && i == 1) || (name != "sort" && i == 0))
                    cs = &args.pos[i];
                else if ((name == "sort" && i == 2) || (name != "sort" && i == 1))
                    attr = &args.pos[i];
                else
                    fail(name + ": too many arguments");
            }
            for (const auto &kv : args.kw) {
                if (kv.first == "case_sensitive")
                    cs = &kv.second;
                else if (kv.first == "attribute")
                    attr = &kv.second;
                else if (kv.first == "reverse" && name == "sort")
                    rev = &kv.second;
                else
                    fail(name + ": unexpected keyword argument '" + kv.first + "'");
            }
            auto key = [&](const Value &x) {
                Value k = attr && attr->k != Value::None ? attr_path(x, to_str(*attr)) : x;
                if (!(cs && truthy(*cs)) && k.k == Value::Str) k.s = map_case(k.s, 0);
                return k;
            };
            auto items = iterate(v);
            if (name == "unique") {
                List out;
                std::vector<Value> seen;
                for (const auto &x : items) {
                    const Value k = key(x);
                    bool dup = false;
                    for (const auto &s : seen) dup = dup || equal(s, k);
                    if (!dup) {
                        seen.push_back(k);
                        out.push_back(x);
                    }
                }
                return Value::gen(std::move(out));
            }
            if (name == "sort") {
                std::stable_sort(items.begin(), items.end(), [&](const Value &a, const Value &b) {
                    return compare(key(a), key(b), "<") < 0;
                });
                if (rev && truthy(*rev)) std::reverse(items.begin(), items.end());
                return Value::list(std::move(items));
            }
            if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
            size_t best = 0;
            for (size_t i = 1; i < items.size(); ++i) {
                const int c = compare(key(items[i]), key(items[best]), "<");
                if (name == "min" ? c < 0 : c > 0) best = i;
            }
            return items[best];
        }
        if (name == "sum") {
            args.expect("sum", {"attribute", "start"});
            const Value *attr = args.get(0, "attribute");
            const Value *start = args.get(1, "start");
            Value acc = start ? *start : Value::integer(0);
            for (const auto &x : iterate(v))
                acc = binop("+", acc,
                            attr && attr->k != Value::None ? attr_path(x, to_str(*attr)) : x);
            return acc;
        }
        if (name == "abs") {
            if (!is_number(v)) fail("abs: not a number");
            if (is_intlike(v) && as_int(v) == INT64_MIN)
                fail("unsupported: integer overflow beyond 64 bits");
            return is_intlike(v) ? Value::integer(std::llabs(as_int(v)))
                                 : Value::real(std::fabs(v.f));
        }
        if (name == "int" || name == "float") {
            args.expect(name, {"default"});
            const Value *dv = args.get(0, "default");
            const Value fallback = dv ? *dv : (name == "int" ? Value::integer(0) : Value::real(0));
            // Python's int(float): NaN and infinities have none (Jinja gives the
            // default); one past 64 bits would be a big integer.
            auto to_int = [&](double d) -> Value {
                if (!std::isfinite(d)) return fallback;
                if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0))
                    fail("int: unsupported: " + py_float(d) + " does not fit in 64 bits");
                return Value::integer(static_cast<int64_t>(d));
            };
            if (is_number(v))
                return name == "int" ? (is_intlike(v) ? Value::integer(as_int(v)) : to_int(v.f))
                                     : Value::real(as_double(v));
            if (v.k == Value::Str) {
                const std::string t = unicode::strip(v.s);
                char *end = nullptr;
                if (name == "int") {
                    errno = 0;
                    const long long x = std::strtoll(t.c_str(), &end, 10);
                    if (!t.empty() && end && *end == '\0') {
                        if (errno == ERANGE)
                            fail("int: unsupported: " + t + " does not fit in 64 bits");
                        return Value::integer(x);
                    }
                    const double d = std::strtod(t.c_str(), &end);
                    if (!t.empty() && end && *end == '\0') return to_int(d);
                } else {
                    const double d = std::strtod(t.c_str(), &end);
                    if (!t.empty() && end && *end == '\0') return Value::real(d);
                }
            }
            return fallback;
        }
        if (name == "indent") {
            args.expect("indent", {"width", "first", "blank"});
            const Value *w = args.get(0, "width");
            std::string pad = "    ";
            if (w && w->k != Value::Str && (!is_intlike(*w) || as_int(*w) > 1024))
                fail("indent: width must be an integer up to 1024 or a string");
            if (w)
                pad = w->k == Value::Str
                          ? w->s
                          : std::string(static_cast<size_t>(std::max<int64_t>(0, as_int(*w))), ' ');
            const Value *first = args.get(1, "first");
            const Value *blank = args.get(2, "blank");
            std::string s = need_str(v);
            std::string out;
            // Jinja: lines joined with "\n" + pad, blank lines skipped unless blank=True.
            const std::vector<std::string> lines = split(s, '\n');
            const bool keep_blank = blank && truthy(*blank);
            if (first && truthy(*first)) out = pad;
            for (size_t i = 0; i < lines.size(); ++i) {
                if (i > 0) {
                    out += "\n";
                    if (keep_blank || !unicode::strip(lines[i]).empty()) out += pad;
                }
                out += lines[i];
                check_size(out, "indent");
            }
            return Value::str(std::move(out));
        }
        fail("unsupported filter '" + name + "'");
    }

    bool apply_test(const std::string &name, const Value &v, const Args &args) {
        // The tests that compare with one argument; the others take none.
        static const std::set<std::string> kOneArg = {
            "divisibleby", "eq", "equalto", "==", "ne", "!=", "sameas", "in",
            "lt",          "<",  "le",      "<=", "gt", ">",  "ge",     ">="};
        const size_t want = kOneArg.count(name) ? 1 : 0;
        if (!args.kw.empty())
            fail("test '" + name + "' got an unexpected keyword argument '" + args.kw[0].first +
                 "'");
        if (args.pos.size() != want)
            fail("test '" + name + "' takes " + (want ? "1 argument" : "no argument") + " (" +
                 std::to_string(args.pos.size()) + " given)");
        auto arg0 = [&]() -> const Value & { return args.pos[0]; };
        if (name == "defined") return v.k != Value::Undefined;
        if (name == "undefined") return v.k == Value::Undefined;
        if (name == "none") return v.k == Value::None;
        if (name == "string") return v.k == Value::Str;
        if (name == "mapping") return v.k == Value::DictK && !v.d->is_namespace;
        if (name == "iterable")
            return v.k == Value::Str || v.k == Value::ListK || v.k == Value::Undefined ||
                   (v.k == Value::DictK && !v.d->is_namespace);
        if (name == "sequence")
            return v.k == Value::Str || v.k == Value::ListK ||
                   (v.k == Value::DictK && !v.d->is_namespace);
        if (name == "number") return is_number(v);
        if (name == "integer") return v.k == Value::Int;
        if (name == "float") return v.k == Value::Float;
        if (name == "boolean") return v.k == Value::Bool;
        if (name == "true") return v.k == Value::Bool && v.b;
        if (name == "false") return v.k == Value::Bool && !v.b;
        if (name == "callable") return v.k == Value::Func;
        if (name == "escaped") return false;
        if (name == "odd" || name == "even") {
            if (!is_intlike(v)) fail("test '" + name + "': not an integer");
            const bool odd = (as_int(v) % 2) != 0;
            return name == "odd" ? odd : !odd;
        }
        if (name == "divisibleby") {
            const Value &d = arg0();
            if (!is_intlike(v) || !is_intlike(d) || as_int(d) == 0)
                fail("divisibleby: bad operands");
            if (as_int(d) == -1) return true; // (INT64_MIN % -1 traps)
            return as_int(v) % as_int(d) == 0;
        }
        if (name == "lower" || name == "upper") {
            if (v.k != Value::Str) return false;
            return map_case(v.s, name == "upper") == v.s;
        }
        if (name == "equalto" || name == "eq" || name == "==") return equal(v, arg0());
        if (name == "ne" || name == "!=") return !equal(v, arg0());
        if (name == "sameas") {
            const Value &o = arg0();
            if (v.k != o.k) return false;
            if (v.k == Value::None || v.k == Value::Undefined) return true;
            if (v.k == Value::Bool) return v.b == o.b;
            if (v.k == Value::ListK) return v.l == o.l;
            if (v.k == Value::DictK) return v.d == o.d;
            return equal(v, o);
        }
        if (name == "in") return contains(arg0(), v);
        const int c = compare(v, arg0(), name.c_str());
        if (name == "lt" || name == "<") return c < 0;
        if (name == "le" || name == "<=") return c <= 0;
        if (name == "gt" || name == ">") return c > 0;
        if (name == "ge" || name == ">=") return c >= 0;
        fail("unsupported test '" + name + "'");
    }

    // ---- statements
    Flow exec(const Body &body, std::string &out) {
        for (const auto &n : body) {
            const Flow f = exec(*n, out);
            if (f != Flow::Next) return f;
        }
        return Flow::Next;
    }

    Flow exec(const Node &n, std::string &out) {
        try {
            Frame_ guard(this);
            charge(1);
            const Flow f = exec_inner(n, out);
            if (out.size() > kMaxOutputBytes)
                fail("the rendered text is longer than " + mib(kMaxOutputBytes));
            return f;
        } catch (JError &err) {
            if (err.line == 0) err.line = n.line;
            throw;
        }
    }

    void assign_targets(const std::vector<std::string> &targets, const Value &v) {
        if (targets.size() == 1) {
            assign(targets[0], v);
            return;
        }
        const auto items = iterate(v);
        if (items.size() != targets.size())
            fail("cannot unpack " + std::to_string(items.size()) + " values into " +
                 std::to_string(targets.size()) + " names");
        for (size_t i = 0; i < targets.size(); ++i) assign(targets[i], items[i]);
    }

    Flow exec_inner(const Node &n, std::string &out) {
        switch (n.k) {
            case Node::Text:
                out += n.text;
                return Flow::Next;
            case Node::Out:
                out += to_str(eval(*n.e));
                return Flow::Next;
            case Node::If:
                for (const auto &br : n.branches)
                    if (truthy(eval(*br.first))) return exec(br.second, out);
                return exec(n.else_body, out);
            case Node::For: {
                const Value seq = eval(*n.e);
                std::vector<Value> items = iterate(seq);
                frames.push_back(std::make_shared<Frame>());
                struct Pop {
                    Evaluator *ev;
                    ~Pop() { ev->frames.pop_back(); }
                } pop{this};
                if (n.filter) {
                    std::vector<Value> kept;
                    for (const auto &x : items) {
                        assign_targets(n.targets, x);
                        if (truthy(eval(*n.filter))) kept.push_back(x);
                    }
                    items = std::move(kept);
                }
                if (items.empty()) {
                    frames.pop_back();
                    Flow f = exec(n.else_body, out);
                    frames.push_back(std::make_shared<Frame>());
                    return f;
                }
                const int64_t len = static_cast<int64_t>(items.size());
                for (int64_t i = 0; i < len; ++i) {
                    charge(1);
                    Value loop = Value::dict();
                    Dict &d = *loop.d;
                    d.set("index", Value::integer(i + 1));
                    d.set("index0", Value::integer(i));
                    d.set("revindex", Value::integer(len - i));
                    d.set("revindex0", Value::integer(len - i - 1));
                    d.set("first", Value::boolean(i == 0));
                    d.set("last", Value::boolean(i == len - 1));
                    d.set("length", Value::integer(len));
                    d.set("previtem", i > 0 ? items[static_cast<size_t>(i - 1)]
                                            : Value::undefined("there is no previous item"));
                    d.set("nextitem", i + 1 < len ? items[static_cast<size_t>(i + 1)]
                                                  : Value::undefined("there is no next item"));
                    d.set("depth", Value::integer(1));
                    d.set("depth0", Value::integer(0));
                    d.set("cycle", Value::func([i](Args &a) -> Value {
                              if (a.pos.empty()) fail("loop.cycle() needs arguments");
                              return a.pos[static_cast<size_t>(i) % a.pos.size()];
                          }));
                    assign("loop", loop);
                    assign_targets(n.targets, items[static_cast<size_t>(i)]);
                    const Flow f = exec(n.body, out);
                    if (f == Flow::Break) break;
                }
                return Flow::Next;
            }
            case Node::Set: {
                const Value v = eval(*n.e);
                if (n.attr_target) {
                    const Value *ns = lookup(n.targets[0]);
                    if (!ns || ns->k != Value::DictK || !ns->d->is_namespace)
                        fail("cannot assign attribute on non-namespace object '" + n.targets[0] +
                             "'");
                    ns->d->set(n.targets[1], v);
                } else
                    assign_targets(n.targets, v);
                return Flow::Next;
            }
            case Node::SetBlock: {
                std::string s;
                exec(n.body, s);
                assign(n.targets[0], Value::str(s));
                return Flow::Next;
            }
            case Node::Macro: {
                const Node *node = &n;
                // The macro sees the globals and the template's top level; it
                // holds them weakly (it is stored in them), they outlive it.
                std::vector<std::weak_ptr<Frame>> root(
                    frames.begin(), frames.begin() + std::min<size_t>(2, frames.size()));
                assign(n.text, Value::func([this, node, root](Args &a) -> Value {
                           std::vector<std::shared_ptr<Frame>> scope;
                           for (const auto &w : root) scope.push_back(w.lock());
                           return call_macro(*node, scope, a);
                       }));
                return Flow::Next;
            }
            case Node::Break:
                return Flow::Break;
            case Node::Continue:
                return Flow::Continue;
            case Node::FilterBlock: {
                std::string s;
                exec(n.body, s);
                out += to_str(apply_filter_chain(*n.filter, Value::str(s)));
                return Flow::Next;
            }
            case Node::Block:
                return exec(n.body, out);
        }
        return Flow::Next;
    }

    Value apply_filter_chain(const Expr &f, const Value &input) {
        const Value inner = f.a[0] ? apply_filter_chain(*f.a[0], input) : input;
        Args args = eval_args(f, 1);
        return apply_filter(f.name, inner, args);
    }

    Value call_macro(const Node &m, const std::vector<std::shared_ptr<Frame>> &root, Args &a) {
        if (a.pos.size() > m.targets.size())
            fail("macro '" + m.text + "' takes " + std::to_string(m.targets.size()) +
                 " arguments (" + std::to_string(a.pos.size()) + " given)");
        if (depth + 1 > kMaxMacroDepth)
            fail("macro '" + m.text + "': calls nested deeper than " +
                 std::to_string(kMaxMacroDepth) + " (recursion too deep)");
        ++depth;
        auto saved = std::move(frames);
        frames = root;
        frames.push_back(std::make_shared<Frame>());
        struct Restore {
            Evaluator *ev;
            std::vector<std::shared_ptr<Frame>> *saved;
            ~Restore() {
                ev->frames = std::move(*saved);
                --ev->depth;
            }
        } restore{this, &saved};
        for (size_t i = 0; i < m.targets.size(); ++i) {
            const Value *given = i < a.pos.size() ? &a.pos[i] : nullptr;
            for (const auto &kv : a.kw)
                if (kv.first == m.targets[i]) given = &kv.second;
            if (given)
                assign(m.targets[i], *given);
            else if (m.defaults[i])
                assign(m.targets[i], eval(*m.defaults[i]));
            else
                assign(m.targets[i],
                       Value::undefined("macro parameter '" + m.targets[i] + "' was not given"));
        }
        for (const auto &kv : a.kw)
            if (std::find(m.targets.begin(), m.targets.end(), kv.first) == m.targets.end())
                fail("macro '" + m.text + "' takes no keyword argument '" + kv.first + "'");
        std::string out;
        exec(m.body, out);
        return Value::str(out);
    }
};

// The lowest stack address a render starting here may reach: kMaxStackBytes
// below, or less where the thread's stack ends sooner (keeping kStackMargin).
uintptr_t stack_floor() {
    const auto here = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
    uintptr_t floor = here > kMaxStackBytes ? here - kMaxStackBytes : 0;
    pthread_attr_t attr;
    if (pthread_getattr_np(pthread_self(), &attr) == 0) {
        void *addr = nullptr;
        size_t size = 0;
        if (pthread_attr_getstack(&attr, &addr, &size) == 0) {
            const auto lowest = reinterpret_cast<uintptr_t>(addr) + kStackMargin;
            floor = std::max(floor, std::min(lowest, here));
        }
        pthread_attr_destroy(&attr);
    }
    return floor;
}

// The namespaces a render made. A namespace is the one mutable value, so the
// only way to a reference cycle (`{% set ns.x = [ns] %}`); the render empties
// those left at its end, which frees the cycles.
using Namespaces = std::vector<std::weak_ptr<Dict>>;

Frame make_globals(const RenderOptions &options, const std::shared_ptr<Namespaces> &made) {
    Frame g;
    g["raise_exception"] = Value::func([](Args &a) -> Value {
        a.expect("raise_exception", {"message"}, 1);
        fail("raise_exception: " + to_str(*a.get(0, "message")));
    });
    g["strftime_now"] = Value::func([options](Args &a) -> Value {
        a.expect("strftime_now", {"format"}, 1);
        const std::string fmt = str_arg(a.get(0, "format"), "strftime_now() format");
        std::tm tm{};
        if (options.now) {
            const std::time_t t = static_cast<std::time_t>(*options.now);
            gmtime_r(&t, &tm);
        } else {
            const std::time_t t = std::time(nullptr);
            localtime_r(&t, &tm);
        }
        char buf[256];
        const size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
        return Value::str(std::string(buf, n));
    });
    // dict() and namespace(): the items of the dicts given, then the keyword arguments.
    auto dict_of = [](Args &a, bool is_namespace) {
        Value d = Value::dict();
        d.d->is_namespace = is_namespace;
        for (const auto &p : a.pos) {
            if (p.k != Value::DictK)
                fail(std::string(is_namespace ? "namespace" : "dict") +
                     "() takes keyword arguments or a dict");
            for (const auto &kv : p.d->items) d.d->set(kv.first, kv.second);
        }
        for (const auto &kv : a.kw) d.d->set(kv.first, kv.second);
        return d;
    };
    g["namespace"] = Value::func([dict_of, made](Args &a) {
        Value ns = dict_of(a, true);
        made->push_back(ns.d);
        return ns;
    });
    g["dict"] = Value::func([dict_of](Args &a) { return dict_of(a, false); });
    g["range"] = Value::func([](Args &a) -> Value {
        if (a.pos.empty() || a.pos.size() > 3 || !a.kw.empty())
            fail("range() takes 1 to 3 integers");
        for (const auto &x : a.pos)
            if (!is_intlike(x)) fail("range() arguments must be integers");
        int64_t start = 0, stop, step = 1;
        if (a.pos.size() == 1)
            stop = as_int(a.pos[0]);
        else {
            start = as_int(a.pos[0]);
            stop = as_int(a.pos[1]);
            if (a.pos.size() == 3) step = as_int(a.pos[2]);
        }
        if (step == 0) fail("range() step must not be zero");
        // The count first (in 64-bit unsigned arithmetic: no overflow whatever
        // the bounds), then the items start + k * step, each within [start, stop).
        uint64_t count = 0;
        if (step > 0 && stop > start)
            count = (static_cast<uint64_t>(stop) - static_cast<uint64_t>(start) - 1) /
                        static_cast<uint64_t>(step) +
                    1;
        else if (step < 0 && start > stop)
            count = (static_cast<uint64_t>(start) - static_cast<uint64_t>(stop) - 1) /
                        (0 - static_cast<uint64_t>(step)) +
                    1;
        if (count > kMaxListItems)
            fail("range(): more than " + std::to_string(kMaxListItems) + " items");
        List out;
        out.reserve(count);
        for (uint64_t k = 0; k < count; ++k)
            out.push_back(Value::integer(static_cast<int64_t>(static_cast<uint64_t>(start) +
                                                              k * static_cast<uint64_t>(step))));
        return Value::list(std::move(out));
    });
    return g;
}

} // namespace

struct Template::Impl {
    std::string where;
    Body body;
};

Template::Template(const std::string &source, const std::string &where)
    : impl_(std::make_unique<Impl>()) {
    impl_->where = where;
    Lexer lex;
    lex.src = source;
    lex.where = where;
    lex.run();
    Parser parser;
    parser.toks = std::move(lex.out);
    parser.where = where;
    std::string found;
    try {
        impl_->body = parser.parse_body({}, &found, 1, "");
    } catch (const JError &e) {
        throw Error(where + ": " + e.msg);
    }
}

Template::~Template() = default;

std::string Template::render(const nlohmann::ordered_json &context,
                             const RenderOptions &options) const {
    // This render's work budget (kMaxWork), and its namespaces emptied at the end.
    struct Scope {
        int64_t saved = work_left;
        std::shared_ptr<Namespaces> made = std::make_shared<Namespaces>();
        Scope() { work_left = kMaxWork; }
        ~Scope() {
            for (const auto &w : *made)
                if (auto d = w.lock()) {
                    auto items = std::move(d->items);
                    d->items.clear();
                }
            work_left = saved;
        }
    } scope;
    Evaluator ev;
    ev.stack_floor = stack_floor();
    ev.options = options;
    ev.frames.push_back(std::make_shared<Frame>(make_globals(options, scope.made)));
    auto root = std::make_shared<Frame>();
    try {
        if (!context.is_null()) {
            if (!context.is_object())
                throw Error(impl_->where + ": the context must be a JSON object");
            for (auto it = context.begin(); it != context.end(); ++it)
                (*root)[it.key()] = from_json(it.value());
        }
        ev.frames.push_back(root);
        std::string out;
        ev.exec(impl_->body, out);
        return out;
    } catch (const JError &e) {
        throw Error(impl_->where + (e.line ? " line " + std::to_string(e.line) : std::string()) +
                    ": " + e.msg);
    }
}

} // namespace rl::core::jinja
