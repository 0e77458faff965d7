// Checks on plugin files before dlopen, and on strings plugins hand the host.
#include "untrusted.hpp"

#include "rl/host/runtime.hpp"

#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

namespace rl::host {

namespace {

// ---- text -------------------------------------------------------------------

// The length of the valid UTF-8 sequence at p (avail bytes readable), 0 when
// the bytes there are not one; *cp receives its code point.
size_t utf8_sequence(const unsigned char *p, size_t avail, uint32_t *cp) {
    const unsigned char c = p[0];
    size_t len = 0;
    uint32_t lo = 0x80, hi = 0xBF; // the allowed range of the second byte
    if (c < 0x80) {
        *cp = c;
        return 1;
    } else if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
        *cp = c & 0x1Fu;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        *cp = c & 0x0Fu;
        if (c == 0xE0) lo = 0xA0; // overlong
        if (c == 0xED) hi = 0x9F; // UTF-16 surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        *cp = c & 0x07u;
        if (c == 0xF0) lo = 0x90; // overlong
        if (c == 0xF4) hi = 0x8F; // above U+10FFFF
    } else {
        return 0; // a continuation byte, an overlong lead (C0, C1) or F5..FF
    }
    if (avail < len) return 0;
    for (size_t k = 1; k < len; ++k) {
        const unsigned char b = p[k];
        if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) return 0;
        *cp = (*cp << 6) | (b & 0x3Fu);
    }
    return len;
}

bool is_control(uint32_t cp, bool multiline) {
    if (multiline && (cp == '\n' || cp == '\t')) return false;
    return cp < 0x20 || (cp >= 0x7F && cp <= 0x9F); // C0, DEL and C1
}

std::string hex_byte(unsigned char b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "0x%02x", b);
    return buf;
}

std::string code_point(uint32_t cp) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "U+%04X", static_cast<unsigned>(cp));
    return buf;
}

// ---- ELF ----------------------------------------------------------------------

constexpr unsigned char kNativeClass = sizeof(void *) == 8 ? ELFCLASS64 : ELFCLASS32;
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
constexpr unsigned char kNativeData = ELFDATA2LSB;
#else
constexpr unsigned char kNativeData = ELFDATA2MSB;
#endif
#if defined(__x86_64__)
constexpr uint16_t kNativeMachine = EM_X86_64;
#elif defined(__aarch64__)
constexpr uint16_t kNativeMachine = EM_AARCH64;
#elif defined(__i386__)
constexpr uint16_t kNativeMachine = EM_386;
#elif defined(__arm__)
constexpr uint16_t kNativeMachine = EM_ARM;
#elif defined(__powerpc64__)
constexpr uint16_t kNativeMachine = EM_PPC64;
#elif defined(__riscv)
constexpr uint16_t kNativeMachine = EM_RISCV;
#elif defined(__s390x__)
constexpr uint16_t kNativeMachine = EM_S390;
#else
constexpr uint16_t kNativeMachine = EM_NONE; // an architecture not listed here: not checked
#endif

std::string machine_name(uint16_t m) {
    switch (m) {
        case EM_X86_64:
            return "x86-64";
        case EM_AARCH64:
            return "AArch64";
        case EM_386:
            return "x86 (32-bit)";
        case EM_ARM:
            return "ARM (32-bit)";
        case EM_PPC64:
            return "PowerPC64";
        case EM_RISCV:
            return "RISC-V";
        case EM_S390:
            return "S/390";
        default:
            return "machine " + std::to_string(m);
    }
}

std::string class_name(unsigned char c) {
    return c == ELFCLASS64 ? "64-bit (ELFCLASS64)" : "32-bit (ELFCLASS32)";
}

std::string file_type(mode_t mode) {
    if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
    if (S_ISSOCK(mode)) return "a socket";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISDIR(mode)) return "a directory";
    return "not a regular file";
}

[[noreturn]] void not_regular(mode_t mode) {
    throw HostError{RL_ERR_INVALID_ARG,
                    "the file is " + file_type(mode) +
                        ", not a regular file (a plugin library is an ELF shared object); not "
                        "opened"};
}

// [off, off + len) lies within a file of `size` bytes (no overflow).
bool within(uint64_t off, uint64_t len, uint64_t size) {
    return off <= size && len <= size - off;
}

// "N bytes at offset X" (no sum: hostile values could overflow it).
std::string extent(uint64_t off, uint64_t len) {
    return std::to_string(len) + " bytes at offset " + std::to_string(off);
}

[[noreturn]] void truncated(const std::string &what, uint64_t size) {
    throw HostError{RL_ERR_IO, "the file is truncated or corrupt: " + what +
                                   " ends past the end of the file (" + std::to_string(size) +
                                   " bytes)"};
}

// An open file descriptor, closed on scope exit.
struct Fd {
    int fd = -1;
    ~Fd() {
        if (fd >= 0) ::close(fd);
    }
};

// Reads exactly len bytes at off (the caller checked that they are in the file).
void read_at(int fd, void *buf, size_t len, uint64_t off) {
    auto *p = static_cast<char *>(buf);
    while (len > 0) {
        const ssize_t n = ::pread(fd, p, len, static_cast<off_t>(off));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0)
            throw HostError{RL_ERR_IO, std::string("cannot read the file: ") +
                                           (n < 0 ? std::strerror(errno) : "it shrank while read")};
        p += n;
        len -= static_cast<size_t>(n);
        off += static_cast<uint64_t>(n);
    }
}

} // namespace

void check_library_file(const std::string &path) {
    // stat() first: it never blocks, whatever the file is.
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0)
        throw HostError{errno == ENOENT ? RL_ERR_NOT_FOUND : RL_ERR_IO,
                        std::string("cannot stat the file: ") + std::strerror(errno)};
    if (!S_ISREG(st.st_mode)) not_regular(st.st_mode);
    // O_NONBLOCK: should the path have become a FIFO since stat(), open() does
    // not wait for a writer; fstat() then refuses it.
    Fd f;
    f.fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (f.fd < 0)
        throw HostError{RL_ERR_IO, std::string("cannot open the file: ") + std::strerror(errno)};
    if (::fstat(f.fd, &st) != 0)
        throw HostError{RL_ERR_IO, std::string("cannot stat the file: ") + std::strerror(errno)};
    if (!S_ISREG(st.st_mode)) not_regular(st.st_mode);
    const uint64_t size = static_cast<uint64_t>(st.st_size);

    unsigned char ident[EI_NIDENT] = {};
    if (size < SELFMAG)
        throw HostError{RL_ERR_IO, "not an ELF file: it is only " + std::to_string(size) +
                                       " bytes long, shorter than the ELF magic"};
    read_at(f.fd, ident, size < EI_NIDENT ? size : EI_NIDENT, 0);
    if (std::memcmp(ident, ELFMAG, SELFMAG) != 0)
        throw HostError{RL_ERR_IO,
                        "not an ELF file: it does not start with the ELF magic 7f 45 4c 46"};
    if (size < sizeof(ElfW(Ehdr)))
        truncated("the ELF header (" + extent(0, sizeof(ElfW(Ehdr))) + ")", size);
    if (ident[EI_CLASS] != ELFCLASS32 && ident[EI_CLASS] != ELFCLASS64)
        throw HostError{RL_ERR_IO,
                        "corrupt ELF header: invalid ELF class " + std::to_string(ident[EI_CLASS])};
    if (ident[EI_CLASS] != kNativeClass)
        throw HostError{RL_ERR_INCOMPATIBLE, "the library is " + class_name(ident[EI_CLASS]) +
                                                 "; this host loads " + class_name(kNativeClass) +
                                                 " libraries"};
    if (ident[EI_DATA] != kNativeData)
        throw HostError{RL_ERR_INCOMPATIBLE,
                        std::string("the library's byte order is ") +
                            (ident[EI_DATA] == ELFDATA2MSB ? "big-endian"
                             : ident[EI_DATA] == ELFDATA2LSB
                                 ? "little-endian"
                                 : "invalid (" + std::to_string(ident[EI_DATA]) + ")") +
                            "; this host is " +
                            (kNativeData == ELFDATA2LSB ? "little-endian" : "big-endian")};
    ElfW(Ehdr) eh{};
    read_at(f.fd, &eh, sizeof eh, 0);
    if (eh.e_type != ET_DYN)
        throw HostError{RL_ERR_INCOMPATIBLE,
                        "not a shared object: ELF type " + std::to_string(eh.e_type) +
                            (eh.e_type == ET_EXEC  ? " (an executable)"
                             : eh.e_type == ET_REL ? " (an object file, not linked)"
                                                   : "") +
                            ", expected ET_DYN"};
    if (kNativeMachine != EM_NONE && eh.e_machine != kNativeMachine)
        throw HostError{RL_ERR_INCOMPATIBLE, "the library is built for " +
                                                 machine_name(eh.e_machine) + "; this host is " +
                                                 machine_name(kNativeMachine)};

    // Program headers: their table, and every segment's bytes, inside the file.
    if (eh.e_phnum == 0)
        throw HostError{RL_ERR_IO, "corrupt ELF header: no program headers (nothing to load)"};
    if (eh.e_phnum == PN_XNUM)
        throw HostError{RL_ERR_IO, "the library uses extended program header numbering "
                                   "(PN_XNUM), which this loader does not accept"};
    if (eh.e_phentsize != sizeof(ElfW(Phdr)))
        throw HostError{RL_ERR_IO, "corrupt ELF header: program header size " +
                                       std::to_string(eh.e_phentsize) + ", expected " +
                                       std::to_string(sizeof(ElfW(Phdr)))};
    const uint64_t ph_bytes = uint64_t{eh.e_phnum} * sizeof(ElfW(Phdr));
    if (!within(eh.e_phoff, ph_bytes, size))
        truncated("its program header table (" + extent(eh.e_phoff, ph_bytes) + ")", size);
    std::vector<ElfW(Phdr)> ph(eh.e_phnum);
    read_at(f.fd, ph.data(), ph_bytes, eh.e_phoff);
    bool loadable = false;
    for (size_t i = 0; i < ph.size(); ++i) {
        loadable = loadable || ph[i].p_type == PT_LOAD;
        if (!within(ph[i].p_offset, ph[i].p_filesz, size))
            truncated("segment " + std::to_string(i) + " (" +
                          (ph[i].p_type == PT_LOAD      ? "PT_LOAD, "
                           : ph[i].p_type == PT_DYNAMIC ? "PT_DYNAMIC, "
                                                        : "") +
                          extent(ph[i].p_offset, ph[i].p_filesz) + ")",
                      size);
    }
    if (!loadable) throw HostError{RL_ERR_IO, "corrupt ELF file: no loadable segment (PT_LOAD)"};

    // Section headers (optional: e_shoff 0 means none): their table inside the
    // file. With e_shnum 0 and a table present, the count is section 0's sh_size.
    if (eh.e_shoff != 0) {
        if (eh.e_shentsize != sizeof(ElfW(Shdr)))
            throw HostError{RL_ERR_IO, "corrupt ELF header: section header size " +
                                           std::to_string(eh.e_shentsize) + ", expected " +
                                           std::to_string(sizeof(ElfW(Shdr)))};
        uint64_t count = eh.e_shnum;
        if (count == 0) {
            if (!within(eh.e_shoff, sizeof(ElfW(Shdr)), size))
                truncated("its section header table (" + extent(eh.e_shoff, sizeof(ElfW(Shdr))) +
                              ")",
                          size);
            ElfW(Shdr) first{};
            read_at(f.fd, &first, sizeof first, eh.e_shoff);
            count = first.sh_size;
        }
        // count <= size / entry keeps count * entry from overflowing.
        if (count > size / sizeof(ElfW(Shdr)) ||
            !within(eh.e_shoff, count * sizeof(ElfW(Shdr)), size))
            truncated("its section header table (" + std::to_string(count) + " entries at offset " +
                          std::to_string(eh.e_shoff) + ")",
                      size);
    }
}

std::string text_problem(const char *s, size_t max_bytes, bool multiline) {
    const size_t n = ::strnlen(s, max_bytes + 1);
    if (n > max_bytes) return "is longer than " + std::to_string(max_bytes) + " bytes";
    const auto *p = reinterpret_cast<const unsigned char *>(s);
    for (size_t i = 0; i < n;) {
        uint32_t cp = 0;
        const size_t len = utf8_sequence(p + i, n - i, &cp);
        if (len == 0)
            return "is not valid UTF-8 (byte " + hex_byte(p[i]) + " at offset " +
                   std::to_string(i) + ")";
        if (is_control(cp, multiline))
            return "contains the control character " + code_point(cp) + " at offset " +
                   std::to_string(i);
        i += len;
    }
    return "";
}

std::string escape_text(std::string_view s, bool multiline, size_t max_shown) {
    std::string out;
    const size_t n = s.size() < max_shown ? s.size() : max_shown;
    out.reserve(n);
    const auto *p = reinterpret_cast<const unsigned char *>(s.data());
    for (size_t i = 0; i < n;) {
        uint32_t cp = 0;
        const size_t len = utf8_sequence(p + i, n - i, &cp);
        if (len == 0 || is_control(cp, multiline)) {
            const size_t bad = len == 0 ? 1 : len;
            for (size_t k = 0; k < bad; ++k) out += "\\x" + hex_byte(p[i + k]).substr(2);
            i += bad;
        } else {
            out.append(s.data() + i, len);
            i += len;
        }
    }
    if (n < s.size()) out += "...";
    return out;
}

std::string plugin_message(const char *s) {
    const size_t n = ::strnlen(s, kMaxPluginMessageBytes + 1);
    if (n <= kMaxPluginMessageBytes) return escape_text(std::string_view(s, n), true);
    return escape_text(std::string_view(s, kMaxPluginMessageBytes), true) + " [message cut at " +
           std::to_string(kMaxPluginMessageBytes) + " bytes]";
}

} // namespace rl::host
