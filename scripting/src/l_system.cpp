// Host-facing parts: the Lua state, script execution with file:line errors and
// tracebacks, SIGINT handling, and the small OS helpers rl.run needs (clock,
// terminal detection, folders, atomic file writes).
#include "l_common.hpp"
#include "rl/lua.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <thread>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace rl::lua {
namespace {

char kHostKey = 0; // registry: table {config_json=, plugin_path=, log_level=, script=}

std::atomic<int> g_interrupts{0};
struct sigaction g_old_action;
bool g_installed = false;

void on_sigint(int) {
    const int n = ++g_interrupts;
    if (n == 1) {
        static const char msg[] =
            "\nrl: interrupt: stopping after this step and saving a checkpoint "
            "(Ctrl-C again to abort)\n";
        ssize_t w = write(STDERR_FILENO, msg, sizeof(msg) - 1);
        (void)w;
    } else {
        static const char msg[] = "\nrl: second interrupt: aborting\n";
        ssize_t w = write(STDERR_FILENO, msg, sizeof(msg) - 1);
        (void)w;
        _exit(130);
    }
}

std::string errno_text() {
    return std::strerror(errno);
}

// rl.clock(): monotonic seconds.
int s_clock(lua_State *L) {
    const auto t = std::chrono::steady_clock::now().time_since_epoch();
    lua_pushnumber(L, std::chrono::duration<double>(t).count());
    return 1;
}

// rl.sleep(seconds): pauses this thread (0 <= seconds <= 86400).
int s_sleep(lua_State *L) {
    const lua_Number s = luaL_checknumber(L, 1);
    luaL_argcheck(L, s >= 0 && s <= 86400, 1, "seconds must be in [0, 86400]");
    std::this_thread::sleep_for(std::chrono::duration<double>(s));
    return 0;
}

// rl.time(): wall-clock seconds since the epoch.
int s_time(lua_State *L) {
    const auto t = std::chrono::system_clock::now().time_since_epoch();
    lua_pushnumber(L, std::chrono::duration<double>(t).count());
    return 1;
}

int fd_of(lua_State *L, int arg) {
    if (lua_type(L, arg) == LUA_TNUMBER) return static_cast<int>(luaL_checkinteger(L, arg));
    const char *name = luaL_optstring(L, arg, "stdout");
    if (std::strcmp(name, "stdout") == 0) return STDOUT_FILENO;
    if (std::strcmp(name, "stderr") == 0) return STDERR_FILENO;
    if (std::strcmp(name, "stdin") == 0) return STDIN_FILENO;
    arg_error(L, arg,
              std::string("'stdout', 'stderr', 'stdin' or a descriptor expected, got '") + name +
                  "'");
}

// rl.isatty([stream]): whether stdout (or "stderr", "stdin", a descriptor) is a terminal.
int s_isatty(lua_State *L) {
    lua_pushboolean(L, isatty(fd_of(L, 1)) == 1);
    return 1;
}

// rl.terminal_width([stream]): columns of the terminal, or nil.
int s_terminal_width(lua_State *L) {
    winsize ws{};
    if (ioctl(fd_of(L, 1), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
        lua_pushinteger(L, ws.ws_col);
    else
        lua_pushnil(L);
    return 1;
}

// rl.mkdir(path): creates the folder and its parents; an existing folder is fine.
int s_mkdir(lua_State *L) {
    const std::string path = luaL_checkstring(L, 1);
    luaL_argcheck(L, !path.empty(), 1, "empty path");
    std::string cur;
    size_t pos = 0;
    while (pos != std::string::npos) {
        pos = path.find('/', pos + 1);
        cur = path.substr(0, pos);
        if (cur.empty()) continue;
        if (mkdir(cur.c_str(), 0777) != 0 && errno != EEXIST)
            return luaL_error(L, "rl.mkdir: cannot create '%s': %s", cur.c_str(),
                              errno_text().c_str());
    }
    struct stat st {};
    if (stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
        return luaL_error(L, "rl.mkdir: '%s' exists and is not a folder", path.c_str());
    return 0;
}

// rl.lock_dir(dir) -> lock: an exclusive lock on `dir`/.lock (flock), held
// until lock:release(), the lock is collected, or the process ends (also by a
// crash: the kernel releases it). A folder another process holds is refused
// with an error naming that process's pid.
const char *const kLockMT = "rl.dir_lock";

int lock_release(lua_State *L) {
    int *fd = static_cast<int *>(luaL_checkudata(L, 1, kLockMT));
    if (*fd >= 0) {
        ::close(*fd); // releases the flock
        *fd = -1;
    }
    return 0;
}

int s_lock_dir(lua_State *L) {
    const std::string dir = luaL_checkstring(L, 1);
    const std::string path = dir + "/.lock";
    int *fd = static_cast<int *>(lua_newuserdatauv(L, sizeof(int), 0));
    *fd = -1;
    if (luaL_newmetatable(L, kLockMT)) {
        lua_pushcfunction(L, lock_release);
        lua_setfield(L, -2, "__gc");
        lua_pushcfunction(L, lock_release);
        lua_setfield(L, -2, "__close");
        lua_newtable(L);
        lua_pushcfunction(L, lock_release);
        lua_setfield(L, -2, "release");
        lua_setfield(L, -2, "__index");
    }
    lua_setmetatable(L, -2);
    *fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (*fd < 0)
        return luaL_error(L, "rl.lock_dir: cannot open '%s': %s", path.c_str(),
                          errno_text().c_str());
    if (::flock(*fd, LOCK_EX | LOCK_NB) != 0) {
        const int err = errno;
        char buf[64] = {0};
        const ssize_t n = ::pread(*fd, buf, sizeof(buf) - 1, 0);
        std::string holder = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
        while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' '))
            holder.pop_back();
        ::close(*fd);
        *fd = -1;
        if (err == EWOULDBLOCK)
            return luaL_error(L,
                              "run folder '%s' is in use by another run (pid %s); wait for it to "
                              "end or choose another run.name",
                              dir.c_str(), holder.empty() ? "unknown" : holder.c_str());
        return luaL_error(L, "rl.lock_dir: cannot lock '%s': %s", path.c_str(), std::strerror(err));
    }
    const std::string pid = std::to_string(::getpid()) + "\n";
    if (::ftruncate(*fd, 0) != 0 ||
        ::pwrite(*fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size()))
        return luaL_error(L, "rl.lock_dir: cannot write '%s': %s", path.c_str(),
                          errno_text().c_str());
    return 1;
}

// rl.exists(path) -> nil | "file" | "dir" | "other"
int s_exists(lua_State *L) {
    struct stat st {};
    if (stat(luaL_checkstring(L, 1), &st) != 0) {
        lua_pushnil(L);
    } else {
        lua_pushstring(L, S_ISDIR(st.st_mode) ? "dir" : S_ISREG(st.st_mode) ? "file" : "other");
    }
    return 1;
}

// rl.list_dir(path) -> sorted names (without . and ..)
int s_list_dir(lua_State *L) {
    const char *path = luaL_checkstring(L, 1);
    DIR *d = opendir(path);
    if (!d) return luaL_error(L, "rl.list_dir: cannot open '%s': %s", path, errno_text().c_str());
    std::vector<std::string> names;
    while (dirent *e = readdir(d)) {
        const std::string n = e->d_name;
        if (n != "." && n != "..") names.push_back(n);
    }
    closedir(d);
    std::sort(names.begin(), names.end());
    lua_createtable(L, static_cast<int>(names.size()), 0);
    for (size_t i = 0; i < names.size(); ++i) {
        lua_pushstring(L, names[i].c_str());
        lua_rawseti(L, -2, static_cast<lua_Integer>(i + 1));
    }
    return 1;
}

// rl.write_file(path, text): atomically (temporary file, fsync, rename).
int s_write_file(lua_State *L) {
    const std::string path = luaL_checkstring(L, 1);
    size_t len = 0;
    const char *data = luaL_checklstring(L, 2, &len);
    const std::string tmp = path + ".tmp." + std::to_string(getpid());
    const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0)
        return luaL_error(L, "rl.write_file: cannot create '%s': %s", tmp.c_str(),
                          errno_text().c_str());
    size_t done = 0;
    bool ok = true;
    while (done < len) {
        const ssize_t w = write(fd, data + done, len - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            ok = false;
            break;
        }
        done += static_cast<size_t>(w);
    }
    const std::string why = ok ? "" : errno_text();
    ok = ok && fsync(fd) == 0;
    close(fd);
    if (!ok || rename(tmp.c_str(), path.c_str()) != 0) {
        const std::string reason = why.empty() ? errno_text() : why;
        unlink(tmp.c_str());
        return luaL_error(L, "rl.write_file: cannot write '%s': %s", path.c_str(), reason.c_str());
    }
    return 0;
}

int remove_entry(const char *path, const struct stat *, int, FTW *) {
    return remove(path);
}

// rl.remove_tree(path): deletes a file or a folder with everything in it.
int s_remove_tree(lua_State *L) {
    const std::string path = luaL_checkstring(L, 1);
    luaL_argcheck(L, !path.empty() && path != "/", 1, "refusing to remove this path");
    struct stat st {};
    if (lstat(path.c_str(), &st) != 0) return 0;
    if (nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
        return luaL_error(L, "rl.remove_tree: cannot remove '%s': %s", path.c_str(),
                          errno_text().c_str());
    return 0;
}

// rl.catch_interrupts(on): install (true) or remove (false) the SIGINT handler.
int s_catch_interrupts(lua_State *L) {
    if (lua_isnone(L, 1) || lua_toboolean(L, 1))
        install_interrupt_handler();
    else
        uninstall_interrupt_handler();
    return 0;
}

// rl.interrupted() -> number of SIGINTs since the handler was installed (0: none).
int s_interrupted(lua_State *L) {
    lua_pushinteger(L, g_interrupts.load());
    return 1;
}

// rl.host() -> {config_json, plugin_path, log_level, script} set by the host
int s_host(lua_State *L) {
    if (lua_rawgetp(L, LUA_REGISTRYINDEX, &kHostKey) != LUA_TTABLE) {
        lua_pop(L, 1);
        lua_newtable(L);
    }
    return 1;
}

// rl.config_load([path [, overrides]]) -> resolved configuration table
int s_config_load(lua_State *L) {
    const char *path = luaL_optstring(L, 1, nullptr);
    std::vector<std::string> sets;
    if (!lua_isnoneornil(L, 2)) {
        luaL_checktype(L, 2, LUA_TTABLE);
        const lua_Integer n = static_cast<lua_Integer>(lua_rawlen(L, 2));
        for (lua_Integer i = 1; i <= n; ++i) {
            lua_rawgeti(L, 2, i);
            if (lua_type(L, -1) != LUA_TSTRING)
                arg_error(L, 2,
                          "overrides[" + std::to_string(i) + "] must be a string, got " +
                              luaL_typename(L, -1));
            sets.emplace_back(lua_tostring(L, -1));
            lua_pop(L, 1);
        }
    }
    std::vector<const char *> ptrs;
    for (const auto &s : sets) ptrs.push_back(s.c_str());
    rl_result_t *res = nullptr;
    check_status(L, rl_config_load(path, ptrs.data(), ptrs.size(), &res), "rl.config_load");
    static const char *const json_texts[] = {"config", nullptr};
    push_result(L, res, json_texts);
    lua_getfield(L, -1, "config");
    return 1;
}

// rl.config_declare(config, declarations) -> the configuration with the
// script's own sections checked and defaulted (rl_config_declare). Both
// arguments are tables or JSON strings.
int s_config_declare(lua_State *L) {
    auto text_of = [L](int idx, const char *what) {
        if (lua_type(L, idx) == LUA_TSTRING) return std::string(lua_tostring(L, idx));
        if (lua_type(L, idx) != LUA_TTABLE)
            arg_error(L, idx,
                      std::string(what) + " must be a table or a JSON string, got " +
                          luaL_typename(L, idx));
        return to_json(L, idx, what);
    };
    const std::string config = text_of(1, "config");
    const std::string decl = text_of(2, "declarations");
    rl_result_t *res = nullptr;
    check_status(L, rl_config_declare(config.c_str(), decl.c_str(), &res), "rl.config");
    static const char *const json_texts[] = {"config", nullptr};
    push_result(L, res, json_texts);
    lua_getfield(L, -1, "config");
    return 1;
}

// rl.config_schema() -> list of {key, type, default, doc, choices, min, max, ...}
int s_config_schema(lua_State *L) {
    rl_result_t *res = nullptr;
    check_status(L, rl_config_schema(&res), "rl.config_schema");
    static const char *const json_texts[] = {"schema", nullptr};
    push_result(L, res, json_texts);
    lua_getfield(L, -1, "schema");
    return 1;
}

int traceback_handler(lua_State *L) {
    const char *msg = lua_tostring(L, 1);
    if (!msg) {
        if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING)
            msg = lua_tostring(L, -1);
        else
            msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    }
    luaL_traceback(L, L, msg, 1);
    return 1;
}

} // namespace

void open_system(lua_State *L, int M) {
    static const luaL_Reg fns[] = {RL_LUA_FN("clock", s_clock),
                                   RL_LUA_FN("time", s_time),
                                   RL_LUA_FN("sleep", s_sleep),
                                   RL_LUA_FN("isatty", s_isatty),
                                   RL_LUA_FN("terminal_width", s_terminal_width),
                                   RL_LUA_FN("mkdir", s_mkdir),
                                   RL_LUA_FN("exists", s_exists),
                                   RL_LUA_FN("lock_dir", s_lock_dir),
                                   RL_LUA_FN("list_dir", s_list_dir),
                                   RL_LUA_FN("write_file", s_write_file),
                                   RL_LUA_FN("remove_tree", s_remove_tree),
                                   RL_LUA_FN("catch_interrupts", s_catch_interrupts),
                                   RL_LUA_FN("interrupted", s_interrupted),
                                   RL_LUA_FN("host", s_host),
                                   RL_LUA_FN("config_load", s_config_load),
                                   RL_LUA_FN("config_schema", s_config_schema),
                                   RL_LUA_FN("config_declare", s_config_declare),
                                   {nullptr, nullptr}};
    lua_pushvalue(L, M);
    luaL_setfuncs(L, fns, 0);
    lua_pop(L, 1);
}

lua_State *new_state(const HostOptions &o) {
    lua_State *L = luaL_newstate();
    if (!L) throw std::bad_alloc();
    luaL_openlibs(L);
    luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
    lua_pushcfunction(L, luaopen_rl);
    lua_setfield(L, -2, "rl");
    lua_pop(L, 1);
    lua_createtable(L, 0, 4);
    lua_pushlstring(L, o.config_json.data(), o.config_json.size());
    lua_setfield(L, -2, "config_json");
    lua_pushlstring(L, o.plugin_path.data(), o.plugin_path.size());
    lua_setfield(L, -2, "plugin_path");
    lua_pushlstring(L, o.log_level.data(), o.log_level.size());
    lua_setfield(L, -2, "log_level");
    lua_pushlstring(L, o.script.data(), o.script.size());
    lua_setfield(L, -2, "script");
    lua_rawsetp(L, LUA_REGISTRYINDEX, &kHostKey);
    return L;
}

bool run_file(lua_State *L, const std::string &path, const std::vector<std::string> &args,
              std::string *error) {
    lua_settop(L, 0);
    lua_pushcfunction(L, traceback_handler);
    if (luaL_loadfilex(L, path.c_str(), "t") != LUA_OK) {
        // "cannot open x.lua" or "x.lua:3: syntax error near ..."
        if (error) *error = lua_tostring(L, -1) ? lua_tostring(L, -1) : "cannot load script";
        lua_settop(L, 0);
        return false;
    }
    lua_createtable(L, static_cast<int>(args.size()), 1);
    lua_pushstring(L, path.c_str());
    lua_rawseti(L, -2, 0);
    for (size_t i = 0; i < args.size(); ++i) {
        lua_pushstring(L, args[i].c_str());
        lua_rawseti(L, -2, static_cast<lua_Integer>(i + 1));
    }
    lua_setglobal(L, "arg");
    for (const auto &a : args) lua_pushstring(L, a.c_str());
    const int st = lua_pcall(L, static_cast<int>(args.size()), 0, 1);
    if (st != LUA_OK) {
        if (error) *error = lua_tostring(L, -1) ? lua_tostring(L, -1) : "script failed";
        lua_settop(L, 0);
        return false;
    }
    lua_settop(L, 0);
    return true;
}

void install_interrupt_handler() {
    if (g_installed) return;
    struct sigaction sa {};
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, &g_old_action);
    g_installed = true;
}

void uninstall_interrupt_handler() {
    if (!g_installed) return;
    sigaction(SIGINT, &g_old_action, nullptr);
    g_installed = false;
}

int interrupt_count() {
    return g_interrupts.load();
}

void reset_interrupts() {
    g_interrupts = 0;
}

} // namespace rl::lua
