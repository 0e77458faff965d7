// plugins/transports/filesystem: messages as folders on a shared file system,
// in Surogate's layout (docs/transports.md):
//
//   {dir}/{channel}/step_{N}/header.json   the wire header (rl/sdk/transport.hpp)
//   {dir}/{channel}/step_{N}/tensors.bin   the tensors' bytes, in header order
//   {dir}/{channel}/step_{N}/STABLE        written last: the step is complete
//
// channel is "rollouts" for training batches and "broadcasts" for weights.
// A writer fills a temporary folder, fsyncs it, writes STABLE and renames it
// into place (over an existing step of that number only on "broadcasts" or
// with replace=true; else as the next free number), then removes all but the
// newest `keep` steps (default: 3 on "broadcasts", none elsewhere). A reader polls for the next
// step in order (mode "queue"; it removes each step it consumed unless consume=false) or for the
// newest one (mode "latest"), checks every checksum, and never sees a half-written step.
#include <rl/sdk/plugin.hpp>
#include <rl/sdk/transport.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

namespace {

namespace fs = std::filesystem;
namespace tp = rl::sdk::transport;

[[noreturn]] void io_error(const std::string &what) {
    rl::sdk::fail(RL_ERR_IO, what + ": " + std::strerror(errno));
}

// Writes all n bytes to fd (named `path` in errors); closes fd on failure.
void write_fd(int fd, const std::string &path, const void *data, size_t n) {
    const auto *p = static_cast<const uint8_t *>(data);
    while (n > 0) {
        const ssize_t w = ::write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            ::close(fd);
            io_error("cannot write " + path);
        }
        p += w;
        n -= static_cast<size_t>(w);
    }
}

int create_file(const std::string &path) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) io_error("cannot create " + path);
    return fd;
}

void sync_close(int fd, const std::string &path) {
    if (::fsync(fd) != 0 || ::close(fd) != 0) io_error("cannot sync " + path);
}

void write_all(const std::string &path, const void *data, size_t n) {
    const int fd = create_file(path);
    write_fd(fd, path, data, n);
    sync_close(fd, path);
}

void fsync_dir(const std::string &path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        ::fsync(fd);
        ::close(fd);
    }
}

// Whole file, or nullopt when it does not exist (any more).
std::optional<std::vector<uint8_t>> read_all(const std::string &path) {
    std::ifstream f(path, std::ios::binary | std::ios::ate);
    if (!f) return std::nullopt;
    const std::streamsize n = f.tellg();
    std::vector<uint8_t> out(static_cast<size_t>(std::max<std::streamsize>(n, 0)));
    f.seekg(0);
    if (n > 0 && !f.read(reinterpret_cast<char *>(out.data()), n)) return std::nullopt;
    return out;
}

// step_<N> -> N; -1 for anything else.
int64_t step_of(const std::string &name) {
    if (name.rfind("step_", 0) != 0 || name.size() == 5) return -1;
    int64_t n = 0;
    for (size_t i = 5; i < name.size(); ++i) {
        if (name[i] < '0' || name[i] > '9') return -1;
        n = n * 10 + (name[i] - '0');
    }
    return n;
}

class Filesystem : public rl::sdk::Transport {
public:
    explicit Filesystem(rl::sdk::Params &p)
        : dir_(p.string("dir", "")), channel_(p.string("channel", "rollouts")),
          mode_(p.choice("mode", "queue", {"queue", "latest"})),
          keep_(p.integer("keep", channel_ == "broadcasts" ? 3 : 0, 0)),
          consume_(p.boolean("consume", mode_ == "queue")),
          replace_(p.boolean("replace", channel_ == "broadcasts")),
          poll_ms_(p.integer("poll_ms", 20, 1, 10000)), next_(p.integer("start_step", -1, -1)) {
        if (dir_.empty()) rl::sdk::invalid(p.owner() + ": parameter 'dir' is required");
        if (channel_.empty() || channel_.find('/') != std::string::npos)
            rl::sdk::invalid(p.owner() + ": parameter 'channel' must be a plain folder name");
        p.finish();
        root_ = (fs::path(dir_) / channel_).string();
    }

    void send(rl::sdk::Call &, const rl_message_view_t &m) override {
        std::vector<tp::OutTensor> tensors;
        const std::string header = tp::encode_header(m, &tensors);
        int64_t step = last_sent_ + 1;
        {
            const auto h = tp::json::parse(header);
            if (h.contains("step")) {
                if (!h["step"].is_number_integer() || h["step"].get<int64_t>() < 0)
                    rl::sdk::invalid("filesystem transport: header 'step' must be an integer >= 0");
                step = h["step"].get<int64_t>();
            } else if (last_sent_ < 0) {
                step = newest_step().value_or(-1) + 1;
            }
        }
        std::error_code ec;
        fs::create_directories(root_, ec);
        if (ec) rl::sdk::fail(RL_ERR_IO, "cannot create " + root_ + ": " + ec.message());
        static std::atomic<int> counter{0};
        const std::string tmp = root_ + "/.tmp-step_" + std::to_string(step) + "-" +
                                std::to_string(::getpid()) + "-" + std::to_string(++counter);
        fs::create_directory(tmp, ec);
        if (ec) rl::sdk::fail(RL_ERR_IO, "cannot create " + tmp + ": " + ec.message());
        try {
            write_all(tmp + "/header.json", header.data(), header.size());
            // One file for all tensors, written piece by piece.
            const std::string bin = tmp + "/tensors.bin";
            const int fd = create_file(bin);
            for (const auto &t : tensors) write_fd(fd, bin, t.data, t.nbytes);
            sync_close(fd, bin);
            write_all(tmp + "/STABLE", "", 0);
            fsync_dir(tmp);
            // A re-sent step replaces the old one (weights of the same
            // version); with replace=false a taken number is never
            // overwritten: the message gets the next free one (a restarted
            // writer loses no unread message of its predecessor).
            for (;;) {
                const std::string final_dir = root_ + "/step_" + std::to_string(step);
                if (replace_ && fs::exists(final_dir)) fs::remove_all(final_dir, ec);
                if (::rename(tmp.c_str(), final_dir.c_str()) == 0) break;
                if (replace_ || (errno != ENOTEMPTY && errno != EEXIST))
                    io_error("cannot publish " + final_dir);
                step = std::max(step, newest_step().value_or(step)) + 1;
            }
            fsync_dir(root_);
        } catch (...) {
            fs::remove_all(tmp, ec);
            throw;
        }
        last_sent_ = step;
        collect_garbage();
    }

    bool recv(rl::sdk::Call &call, int64_t timeout_ms) override {
        const auto deadline =
            std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
        for (;;) {
            if (std::optional<int64_t> step = pick()) {
                if (read_step(call, *step)) return true;
            }
            if (timeout_ms >= 0 && std::chrono::steady_clock::now() >= deadline) return false;
            std::this_thread::sleep_for(std::chrono::milliseconds(poll_ms_));
        }
    }

private:
    // Complete steps present, ascending.
    std::vector<int64_t> stable_steps() const {
        std::vector<int64_t> out;
        std::error_code ec;
        for (fs::directory_iterator it(root_, ec), end; !ec && it != end; it.increment(ec)) {
            const int64_t s = step_of(it->path().filename().string());
            if (s >= 0 && fs::exists(it->path() / "STABLE")) out.push_back(s);
        }
        std::sort(out.begin(), out.end());
        return out;
    }

    std::optional<int64_t> newest_step() const {
        const auto steps = stable_steps();
        if (steps.empty()) return std::nullopt;
        return steps.back();
    }

    // The step to read now, if one is ready.
    std::optional<int64_t> pick() {
        const auto steps = stable_steps();
        if (steps.empty()) return std::nullopt;
        if (mode_ == "latest") {
            if (steps.back() > last_received_) return steps.back();
            return std::nullopt;
        }
        // A consuming reader takes the oldest step present: what it read is
        // gone, so this is the next one, even from a restarted writer.
        if (consume_) return steps.front();
        if (next_ < 0) next_ = steps.front(); // first call: the oldest present
        for (int64_t s : steps)
            if (s >= next_) return s; // the next, or the first after a collected gap
        return std::nullopt;
    }

    bool read_step(rl::sdk::Call &call, int64_t step) {
        const std::string dir = root_ + "/step_" + std::to_string(step);
        const auto header = read_all(dir + "/header.json");
        const auto bytes = read_all(dir + "/tensors.bin");
        if (!header || !bytes) return false; // replaced or collected meanwhile: look again
        std::vector<tp::InTensor> tensors;
        const std::string where = "filesystem transport: " + dir;
        std::string user;
        uint64_t total = 0;
        try {
            user = tp::decode_header(
                std::string_view(reinterpret_cast<const char *>(header->data()), header->size()),
                &tensors, where);
            for (const auto &t : tensors) total += t.nbytes;
            if (total != bytes->size())
                rl::sdk::fail(RL_ERR_INVALID_ARG,
                              where + ": tensors.bin has " + std::to_string(bytes->size()) +
                                  " bytes, the header announces " + std::to_string(total));
            uint64_t off = 0;
            for (const auto &t : tensors) {
                tp::verify(t, bytes->data() + off, where);
                off += t.nbytes;
            }
        } catch (...) {
            // Refused: the error reaches the caller once and the stream moves
            // on, so the next receive gets the next step.
            last_received_ = std::max(last_received_, step);
            next_ = step + 1;
            if (consume_) remove_step(dir);
            throw;
        }
        // Checked: hand everything over.
        call.text("header", user);
        uint64_t off = 0;
        for (const auto &t : tensors) {
            call.tensor(t.name, tp::view_of(t, bytes->data() + off));
            off += t.nbytes;
        }
        if (mode_ == "queue" && !consume_ && next_ >= 0 && step > next_)
            call.metric("transport/skipped_steps", static_cast<double>(step - next_));
        call.metric("transport/step", static_cast<double>(step));
        call.metric("transport/bytes", static_cast<double>(total));
        last_received_ = step;
        next_ = step + 1;
        if (consume_) remove_step(dir); // the host has copied what it emitted
        return true;
    }

    // Removes a consumed step: renamed away first, so that no reader sees it
    // half-removed.
    void remove_step(const std::string &dir) {
        static std::atomic<int> counter{0};
        const std::string gone =
            root_ + "/.consumed-" + std::to_string(::getpid()) + "-" + std::to_string(++counter);
        std::error_code ec;
        if (::rename(dir.c_str(), gone.c_str()) == 0) fs::remove_all(gone, ec);
    }

    void collect_garbage() {
        if (keep_ == 0) return;
        const auto steps = stable_steps();
        std::error_code ec;
        for (size_t i = 0; i + static_cast<size_t>(keep_) < steps.size(); ++i)
            fs::remove_all(root_ + "/step_" + std::to_string(steps[i]), ec);
    }

    std::string dir_, channel_, mode_, root_;
    int64_t keep_;
    bool consume_;
    bool replace_;
    int64_t poll_ms_;
    int64_t next_;               ///< queue: the step to read next (-1: not yet known)
    int64_t last_received_ = -1; ///< latest: the newest step read
    int64_t last_sent_ = -1;
};

} // namespace

RL_PLUGIN_DEFINE(rl::sdk::plugin<Filesystem>(
    "org.rl.transport.filesystem", "filesystem", "1.0.0",
    "Messages as step_N folders with a STABLE marker on a shared file system (Surogate's layout)"))
