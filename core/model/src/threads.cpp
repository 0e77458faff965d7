#include "rl/core/threads.hpp"

#include <ATen/Parallel.h>

#include <sched.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>

namespace rl::core {
namespace {

std::atomic<int> g_configured{0}; // 0: not chosen yet
std::atomic<int> g_generation{1}; // bumped by set_num_threads
thread_local int t_applied_generation = 0;

int env_int(const char *name) {
    const char *v = std::getenv(name);
    if (v == nullptr || *v == '\0') return 0;
    char *end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (end == v || *end != '\0' || n <= 0 || n > 4096) return 0;
    return static_cast<int>(n);
}

} // namespace

int default_num_threads() {
    if (int n = env_int("RL_NUM_THREADS")) return n;
    if (int n = env_int("OMP_NUM_THREADS")) return n;
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
        const int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
    const unsigned hc = std::thread::hardware_concurrency();
    return hc > 0 ? static_cast<int>(hc) : 1;
}

void set_num_threads(int n) {
    if (n <= 0) n = default_num_threads();
    g_configured.store(n);
    g_generation.fetch_add(1);
    at::set_num_threads(n);
    t_applied_generation = g_generation.load();
}

void ensure_threads() {
    const int gen = g_generation.load();
    if (t_applied_generation == gen) return;
    int n = g_configured.load();
    if (n <= 0) {
        n = default_num_threads();
        int expected = 0;
        if (!g_configured.compare_exchange_strong(expected, n)) n = expected;
    }
    if (at::get_num_threads() != n) at::set_num_threads(n);
    t_applied_generation = gen;
}

} // namespace rl::core
