// The plugin host: loading, ABI negotiation, registry, instances.
#include "rl/host/runtime.hpp"

#include "kinds.hpp"
#include "untrusted.hpp"

#define BOOST_DLL_USE_STD_FS 1
#include <boost/dll/shared_library.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>

namespace fs = std::filesystem;

namespace rl::host {

// A loaded plugin library. Unloaded (after deinit) when the runtime goes away.
class Library {
public:
    Library(std::string path, boost::dll::shared_library lib, const rl_plugin_entry_t *entry,
            const rl_plugin_factory_t *factory)
        : path_(std::move(path)), lib_(std::move(lib)), entry_(entry), factory_(factory) {}
    ~Library() {
        if (entry_ && entry_->deinit) entry_->deinit();
    }
    const std::string &path() const { return path_; }
    const rl_plugin_factory_t *factory() const { return factory_; }
    uint32_t abi_version() const { return entry_->abi_version; }
    int live_instances = 0;

private:
    std::string path_;
    boost::dll::shared_library lib_;
    const rl_plugin_entry_t *entry_;
    const rl_plugin_factory_t *factory_;
};

Runtime::Runtime(const rl_runtime_desc_t *desc) {
    fill_host_api(&host_api_, this);
    std::vector<std::string> paths;
    if (desc && desc->plugin_path) {
        std::stringstream ss(desc->plugin_path);
        std::string item;
        while (std::getline(ss, item, ':'))
            if (!item.empty()) paths.push_back(item);
    }
    // Explicit paths: a file that is named explicitly and fails is still only
    // a refusal here (the runtime stays usable); rl_runtime_load_plugin is the
    // call that fails on it.
    for (const auto &p : paths) load_path(p, false);
    if (!(desc && (desc->flags & RL_RUNTIME_NO_DEFAULT_PLUGINS)))
        for (const auto &p : default_plugin_paths()) load_path(p, false);
}

Runtime::~Runtime() {
    // Instances first (they hold code of their libraries), then the libraries.
    std::vector<Instance *> live = instances_;
    for (Instance *inst : live) delete inst;
    plugins_.clear();
    // Unload in reverse order of loading.
    while (!libraries_.empty()) libraries_.pop_back();
}

void Runtime::refuse(const std::string &path, const std::string &reason) {
    spdlog::warn("plugin library {} refused: {}", path, reason);
    refused_.push_back({path, reason});
}

size_t Runtime::load_path(const std::string &path, bool explicit_request) {
    std::error_code ec;
    fs::path p(path);
    if (fs::is_directory(p, ec)) {
        std::vector<std::string> files;
        // Every *.so but folders (not searched recursively): a FIFO, socket or
        // device named *.so is refused by load_library, not skipped silently.
        for (const auto &e : fs::directory_iterator(p, ec)) {
            std::error_code type_ec;
            if (e.path().extension() == ".so" && !e.is_directory(type_ec))
                files.push_back(e.path().string());
        }
        std::sort(files.begin(), files.end());
        size_t n = 0;
        for (const auto &f : files) n += load_path(f, false);
        return n;
    }
    if (!fs::exists(p, ec)) {
        if (fs::is_symlink(fs::symlink_status(p, ec))) {
            // A plugin the user dropped in as a link whose target is gone: refused
            // with the reason, never skipped silently.
            const std::string why = "a symbolic link to '" + fs::read_symlink(p, ec).string() +
                                    "', which does not exist";
            refuse(path, why);
            if (explicit_request) throw HostError{RL_ERR_NOT_FOUND, path + ": " + why};
            return 0;
        }
        if (explicit_request)
            throw HostError{RL_ERR_NOT_FOUND, "plugin path '" + path + "' does not exist"};
        spdlog::debug("plugin path {} does not exist; skipped", path);
        return 0;
    }
    std::string canon = fs::weakly_canonical(p, ec).string();
    if (ec) canon = path;
    if (std::find(loaded_paths_.begin(), loaded_paths_.end(), canon) != loaded_paths_.end())
        return 0; // the same file reached twice (explicit path and default folder)
    const size_t before = plugins_.size();
    try {
        load_library(canon);
    } catch (const HostError &e) {
        refuse(canon, e.message);
        if (explicit_request) throw HostError{e.status, canon + ": " + e.message};
        return 0;
    }
    return plugins_.size() - before;
}

// Why descriptor `d`'s strings are refused ("" when they are not): each field
// named, with its bytes escaped.
static std::string descriptor_text_problem(const rl_plugin_desc_t *d) {
    struct Field {
        std::string name;
        const char *value;
        size_t max_bytes;
        bool multiline;
    };
    std::vector<Field> fields = {{"id", d->id, kMaxDescriptorFieldBytes, false},
                                 {"kind", d->kind, kMaxDescriptorFieldBytes, false},
                                 {"name", d->name, kMaxDescriptorFieldBytes, false},
                                 {"version", d->version, kMaxDescriptorFieldBytes, false}};
    if (d->description)
        fields.push_back({"description", d->description, kMaxDescriptionBytes, true});
    size_t n_features = 0;
    for (const char *const *f = d->features; f && *f; ++f) {
        if (++n_features > kMaxDescriptorFeatures)
            return "features list holds more than " + std::to_string(kMaxDescriptorFeatures) +
                   " strings (or is not NULL-terminated)";
    }
    for (size_t i = 0; i < n_features; ++i)
        fields.push_back({"features[" + std::to_string(i) + "]", d->features[i],
                          kMaxDescriptorFieldBytes, false});
    for (const Field &f : fields) {
        const std::string problem = text_problem(f.value, f.max_bytes, f.multiline);
        if (problem.empty()) continue;
        // Show no more than the limit allows (a longer string may be unterminated).
        const size_t shown = ::strnlen(f.value, f.max_bytes);
        return "field '" + f.name + "' " + problem + ": \"" +
               escape_text(std::string_view(f.value, shown), f.multiline, 64) + "\"";
    }
    return "";
}

Library *Runtime::load_library(const std::string &path) {
    check_library_file(path); // before dlopen maps anything of it
    boost::dll::shared_library lib;
    try {
        lib.load(path, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
    } catch (const std::exception &e) {
        throw HostError{RL_ERR_IO, std::string("cannot load the library: ") + e.what()};
    }
    if (!lib.has(RL_PLUGIN_ENTRY_SYMBOL))
        throw HostError{RL_ERR_NOT_FOUND,
                        std::string("missing the entry symbol '") + RL_PLUGIN_ENTRY_SYMBOL +
                            "' (a plugin library exports it; the SDK's RL_PLUGIN_DEFINE does)"};
    auto entry_fn = lib.get<const rl_plugin_entry_t *(void)>(RL_PLUGIN_ENTRY_SYMBOL);
    const rl_plugin_entry_t *entry = entry_fn();
    if (!entry) throw HostError{RL_ERR_INCOMPATIBLE, "rl_plugin_entry() returned NULL"};
    if (entry->struct_size < kMinEntrySize)
        throw HostError{RL_ERR_INCOMPATIBLE,
                        too_small("", "the entry table", "rl_plugin_entry_t", entry->struct_size,
                                  kMinEntrySize, entry->abi_version)};
    if (!RL_ABI_COMPATIBLE(RL_ABI_VERSION, entry->abi_version))
        throw HostError{RL_ERR_INCOMPATIBLE,
                        "plugin ABI version " + version_string(entry->abi_version) +
                            " is incompatible with the host's ABI version " +
                            version_string(RL_ABI_VERSION) +
                            " (majors must match; under major 0 the plugin's minor must not "
                            "exceed the host's)"};
    if (!entry->init || !entry->deinit || !entry->get_factory)
        throw HostError{RL_ERR_INCOMPATIBLE, "entry table has a NULL function"};
    take_last_plugin_log();
    rl_status_t st = entry->init(&host_api_, path.c_str());
    if (st != RL_OK) {
        std::string logged = take_last_plugin_log();
        throw HostError{st, std::string("the plugin's init() failed with ") + rl_status_name(st) +
                                (logged.empty() ? "" : ": " + logged)};
    }
    auto *factory = static_cast<const rl_plugin_factory_t *>(entry->get_factory(RL_FACTORY_PLUGIN));
    std::string bad_factory;
    if (!factory)
        bad_factory = std::string("get_factory(\"") + RL_FACTORY_PLUGIN + "\") returned NULL";
    else if (factory->struct_size < kMinFactorySize)
        bad_factory = too_small("", "the plugin factory", "rl_plugin_factory_t",
                                factory->struct_size, kMinFactorySize, entry->abi_version);
    else if (!factory->count || !factory->get_desc || !factory->create)
        bad_factory = "the plugin factory has a NULL function (count, get_desc and create are "
                      "mandatory)";
    if (!bad_factory.empty()) {
        entry->deinit();
        throw HostError{RL_ERR_INCOMPATIBLE, bad_factory};
    }
    auto owned = std::make_unique<Library>(path, std::move(lib), entry, factory);
    Library *library = owned.get();
    const uint32_t n = factory->count(factory);
    if (n > kMaxPluginsPerLibrary) // `owned` going away deinits and unloads the library
        throw HostError{RL_ERR_INCOMPATIBLE,
                        "the plugin factory's count() reports " + std::to_string(n) +
                            " plugins, more than the " + std::to_string(kMaxPluginsPerLibrary) +
                            " one library may hold; the library is refused as a whole"};
    size_t registered = 0;
    for (uint32_t i = 0; i < n; ++i) {
        const rl_plugin_desc_t *d = factory->get_desc(factory, i);
        std::string where = "plugin " + std::to_string(i);
        if (!d) {
            refuse(path, where + ": get_desc() returned NULL");
            continue;
        }
        if (d->struct_size < kMinDescSize) {
            refuse(path, too_small("", where, "rl_plugin_desc_t", d->struct_size, kMinDescSize,
                                   d->abi_version));
            continue;
        }
        if (!d->id || !d->kind || !d->name || !d->version) {
            std::string missing;
            for (auto [field, value] : {std::pair<const char *, const char *>{"id", d->id},
                                        {"kind", d->kind},
                                        {"name", d->name},
                                        {"version", d->version}})
                if (!value) missing += (missing.empty() ? "" : ", ") + std::string(field);
            refuse(path, where + ": descriptor is incomplete: " + missing +
                             " is NULL (id, kind, name and version are mandatory)");
            continue;
        }
        if (const std::string bad = descriptor_text_problem(d); !bad.empty()) {
            refuse(path, where + ": descriptor " + bad);
            continue;
        }
        where = std::string(d->kind) + " '" + d->name + "'";
        if (!RL_ABI_COMPATIBLE(RL_ABI_VERSION, d->abi_version)) {
            refuse(path, where + ": plugin ABI version " + version_string(d->abi_version) +
                             " is incompatible with the host's ABI version " +
                             version_string(RL_ABI_VERSION));
            continue;
        }
        if (!find_kind(d->kind)) {
            refuse(path, where + ": unknown kind '" + d->kind + "'; known kinds: " + kind_names());
            continue;
        }
        if (const PluginRecord *prev = find(d->kind, d->name)) {
            refuse(path, where + ": duplicate plugin name; already provided by " + prev->path);
            continue;
        }
        bool dup_id = false;
        for (const auto &r : plugins_) dup_id = dup_id || r.id == d->id;
        if (dup_id) {
            refuse(path, where + ": duplicate plugin id '" + d->id + "'");
            continue;
        }
        PluginRecord rec;
        rec.desc = d;
        rec.library = library;
        rec.path = path;
        rec.kind = d->kind;
        rec.name = d->name;
        rec.id = d->id;
        rec.version = d->version;
        rec.description = d->description ? d->description : "";
        for (const char *const *f = d->features; f && *f; ++f) rec.features.emplace_back(*f);
        plugins_.push_back(rec);
        ++registered;
        spdlog::debug("registered {} '{}' {} from {}", rec.kind, rec.name, rec.version, path);
    }
    loaded_paths_.push_back(path);
    if (registered == 0 && n == 0) spdlog::warn("plugin library {} holds no plugins", path);
    libraries_.push_back(std::move(owned));
    return library;
}

const PluginRecord *Runtime::find(const std::string &kind, const std::string &name) const {
    for (const auto &r : plugins_)
        if (r.kind == kind && r.name == name) return &r;
    return nullptr;
}

std::string Runtime::plugins_json() const {
    nlohmann::json j;
    j["plugins"] = nlohmann::json::array();
    for (const auto &r : plugins_)
        j["plugins"].push_back({{"kind", r.kind},
                                {"name", r.name},
                                {"id", r.id},
                                {"version", r.version},
                                {"abi_version", version_string(r.desc->abi_version)},
                                {"path", r.path},
                                {"description", r.description},
                                {"features", r.features}});
    j["refused"] = nlohmann::json::array();
    for (const auto &r : refused_) j["refused"].push_back({{"path", r.path}, {"reason", r.reason}});
    // Descriptors and reasons are checked or escaped; a path need not be UTF-8.
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::unique_ptr<Instance> Runtime::create(const std::string &kind, const std::string &name,
                                          const std::string &params_json) {
    const PluginRecord *rec = find(kind, name);
    if (!rec) {
        std::string have;
        for (const auto &r : plugins_)
            if (r.kind == kind) have += (have.empty() ? "" : ", ") + r.name;
        if (!find_kind(kind))
            throw HostError{RL_ERR_INVALID_ARG,
                            "unknown plugin kind '" + kind + "'; known kinds: " + kind_names()};
        throw HostError{RL_ERR_NOT_FOUND, "no " + kind + " plugin named '" + name +
                                              "'; available: " + (have.empty() ? "(none)" : have)};
    }
    // Filters: `enforce` is the host's policy, not the detector's parameter.
    std::string params = params_json.empty() ? "{}" : params_json;
    bool enforce = false;
    if (kind == RL_KIND_FILTER) { // the one kind-specific creation rule
        nlohmann::json j;
        try {
            j = nlohmann::json::parse(params);
        } catch (const nlohmann::json::parse_error &e) {
            throw HostError{RL_ERR_INVALID_ARG,
                            kind + " '" + name + "': parameters are not valid JSON: " + e.what()};
        }
        if (j.is_object() && j.contains("enforce")) {
            if (!j["enforce"].is_boolean())
                throw HostError{RL_ERR_INVALID_ARG, kind + " '" + name +
                                                        "': parameter 'enforce' must be true or "
                                                        "false, got " +
                                                        j["enforce"].dump()};
            enforce = j["enforce"].get<bool>();
            j.erase("enforce");
            params = j.dump();
        }
    }
    CallSink sink;
    sink.who = kind + " '" + name + "'";
    rl_call_ctx_t ctx = make_call_ctx(&host_api_, &sink);
    rl_plugin_create_desc_t cd = RL_PLUGIN_CREATE_DESC_INIT;
    cd.params = rl_string_view_t{params.data(), params.size()};
    const rl_plugin_t *plugin = nullptr;
    const rl_plugin_factory_t *f = rec->library->factory();
    rl_status_t st;
    try {
        st = f->create(f, &ctx, rec->id.c_str(), &cd, &plugin);
    } catch (...) {
        throw HostError{RL_ERR_INTERNAL, sink.who + ": an exception escaped create() across the "
                                                    "C ABI (a plugin bug)"};
    }
    if (st != RL_OK)
        throw HostError{st, sink.fail_message.empty()
                                ? sink.who + ": create() failed with " + rl_status_name(st)
                                : sink.fail_message};
    const uint32_t abi = rec->desc->abi_version;
    const std::string where = rec->path + ": " + sink.who;
    if (!plugin)
        throw HostError{RL_ERR_INCOMPATIBLE, where + ": create() returned RL_OK and no instance"};
    // From here on the instance exists: destroy it on every refusal, except
    // when rl_plugin_t is too small to be sure `destroy` is there (it leaks).
    if (plugin->struct_size < kMinPluginSize)
        throw HostError{RL_ERR_INCOMPATIBLE,
                        too_small(rec->path, sink.who + ": create()", "rl_plugin_t",
                                  plugin->struct_size, kMinPluginSize, abi)};
    if (!plugin->destroy || !plugin->get_interface) {
        if (plugin->destroy) plugin->destroy(plugin);
        throw HostError{RL_ERR_INCOMPATIBLE,
                        where + ": the instance's rl_plugin_t has a NULL destroy or get_interface"};
    }
    const KindInfo &k = *find_kind(kind);
    const void *iface = plugin->get_interface(plugin, k.iface_id);
    std::string bad;
    if (!iface) {
        bad = where + ": the instance does not provide the " + k.iface_id + " interface";
    } else {
        const uint32_t size = *static_cast<const uint32_t *>(iface);
        if (size < k.min_iface_size)
            bad = too_small(rec->path, sink.who + ": interface " + k.iface_id, k.iface_struct, size,
                            k.min_iface_size, abi);
        else if (std::string missing = k.missing_slots(iface); !missing.empty())
            bad = where + ": " + k.iface_struct + " has NULL mandatory slot(s): " + missing;
    }
    if (!bad.empty()) {
        plugin->destroy(plugin);
        throw HostError{RL_ERR_INCOMPATIBLE, bad};
    }
    return std::make_unique<Instance>(this, rec, plugin, iface, enforce, params);
}

void Runtime::register_instance(Instance *inst) {
    instances_.push_back(inst);
    inst->record().library->live_instances++;
}
void Runtime::unregister_instance(Instance *inst) {
    auto it = std::find(instances_.begin(), instances_.end(), inst);
    if (it != instances_.end()) {
        instances_.erase(it);
        inst->record().library->live_instances--;
    }
}

Instance::Instance(Runtime *rt, const PluginRecord *rec, const rl_plugin_t *plugin,
                   const void *iface, bool enforce, std::string create_params)
    : rt_(rt), rec_(rec), plugin_(plugin), iface_(iface), enforce_(enforce),
      create_params_(std::move(create_params)) {
    rt_->register_instance(this);
}

Instance::~Instance() {
    rt_->unregister_instance(this);
    plugin_->destroy(plugin_);
}

// The folder holding librl itself.
static fs::path librl_dir() {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void *>(&default_plugin_paths), &info) && info.dli_fname)
        return fs::path(info.dli_fname).parent_path();
    return {};
}

std::vector<std::string> default_plugin_paths() {
    std::vector<std::string> out;
    if (const char *env = std::getenv("RL_PLUGIN_PATH")) {
        std::stringstream ss(env);
        std::string item;
        while (std::getline(ss, item, ':'))
            if (!item.empty()) out.push_back(item);
    }
    fs::path dir = librl_dir();
    if (!dir.empty()) {
        out.push_back((dir.parent_path() / "plugins").string()); // build tree: build/lib/../plugins
        out.push_back((dir / "rl" / "plugins").string());        // install: <libdir>/rl/plugins
    }
    return out;
}

} // namespace rl::host
