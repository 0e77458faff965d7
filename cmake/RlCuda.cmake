# The fused CUDA kernels of the model core (core/model/src/cuda/*.cu) are
# compiled when libtorch has CUDA and nvcc is found; otherwise the build goes on
# without them and the eager libtorch path runs alone (fused_ops.hpp).
# Sets RL_CUDA_KERNELS_BUILT.
#   -DRL_CUDA_KERNELS=OFF              never compile them
#   -DRL_CUDA_ARCHITECTURES="90a-real" the GPUs to compile for
option(RL_CUDA_KERNELS "Compile the fused CUDA kernels when libtorch has CUDA and nvcc is found" ON)
set(RL_CUDA_ARCHITECTURES "80-real;90-real;90-virtual" CACHE STRING
  "CUDA architectures of the fused kernels (A100, H100 / H200, and PTX for newer GPUs)")

set(RL_CUDA_KERNELS_BUILT OFF)
if(RL_TORCH_HAS_CUDA AND RL_CUDA_KERNELS)
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(CMAKE_CUDA_ARCHITECTURES ${RL_CUDA_ARCHITECTURES})
    # TorchConfig leaves its own nvcc flags in CMAKE_CUDA_FLAGS (every
    # architecture of its build, compute_50 among them, which nvcc 13
    # refuses): the kernels take the user's cache value only.
    unset(CMAKE_CUDA_FLAGS)
    if(DEFINED _rl_ccache AND NOT DEFINED CMAKE_CUDA_COMPILER_LAUNCHER)
      set(CMAKE_CUDA_COMPILER_LAUNCHER ${_rl_ccache})
    endif()
    enable_language(CUDA)
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    set(RL_CUDA_KERNELS_BUILT ON)
    message(STATUS "fused CUDA kernels: nvcc ${CMAKE_CUDA_COMPILER_VERSION}, "
      "architectures ${RL_CUDA_ARCHITECTURES}")
  else()
    message(STATUS "fused CUDA kernels: no nvcc found, built without them")
  endif()
endif()
