// The one source of the targets that build the borrowed precompiled
// <ATen/ATen.h> (rl_library_pch, rl_program_pch: core/model/CMakeLists.txt).
int main() {
    return 0;
}
