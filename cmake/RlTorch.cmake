# RlTorch.cmake: finds libtorch >= 2.4 and makes its targets visible to the
# whole tree. Where it looks, first hit wins:
#   1. Torch_DIR, or a CMAKE_PREFIX_PATH entry (cache or environment) holding
#      Torch/TorchConfig.cmake or share/cmake/Torch/TorchConfig.cmake;
#   2. the torch of RL_PYTHON (default: the project venv .venv/bin/python that
#      scripts/install-deps.sh makes, else python3 on PATH), through
#      torch.utils.cmake_prefix_path.
# System folders are never searched: Debian's libtorch (1.13, CPU only) in
# /usr/lib would otherwise be picked up next to the wheel's and the program
# would abort at start with two libtorch builds loaded.
#
# Sets RL_TORCH_VERSION, RL_TORCH_LIB_DIR, RL_TORCH_HAS_CUDA and the usual
# TORCH_LIBRARIES / TORCH_INCLUDE_DIRS.
include_guard(GLOBAL)

set(RL_TORCH_MIN_VERSION 2.4)
set(RL_PYTHON "" CACHE FILEPATH "Python whose torch package provides libtorch (default: .venv/bin/python, else python3)")

function(_rl_torch_dir_from_prefixes out)
  set(prefixes ${CMAKE_PREFIX_PATH})
  if(DEFINED ENV{CMAKE_PREFIX_PATH})
    string(REPLACE ":" ";" env_prefixes "$ENV{CMAKE_PREFIX_PATH}")
    list(APPEND prefixes ${env_prefixes})
  endif()
  foreach(p ${prefixes})
    foreach(sub Torch share/cmake/Torch lib/cmake/Torch)
      if(EXISTS "${p}/${sub}/TorchConfig.cmake")
        set(${out} "${p}/${sub}" PARENT_SCOPE)
        return()
      endif()
    endforeach()
  endforeach()
endfunction()

if(NOT Torch_DIR OR NOT EXISTS "${Torch_DIR}/TorchConfig.cmake")
  unset(_dir)
  _rl_torch_dir_from_prefixes(_dir)
  if(NOT _dir)
    set(_python "${RL_PYTHON}")
    if(NOT _python)
      if(EXISTS "${PROJECT_SOURCE_DIR}/.venv/bin/python")
        set(_python "${PROJECT_SOURCE_DIR}/.venv/bin/python")
      else()
        find_program(_python NAMES python3 python)
      endif()
    endif()
    if(NOT _python)
      message(FATAL_ERROR "libtorch not found: no Torch_DIR, no TorchConfig.cmake under "
        "CMAKE_PREFIX_PATH, and no python to ask. Run scripts/install-deps.sh (it makes .venv with "
        "the pinned torch wheel), or pass -DRL_PYTHON=/path/to/python with torch installed, or "
        "-DCMAKE_PREFIX_PATH=<libtorch>.")
    endif()
    execute_process(
      COMMAND "${_python}" -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
      OUTPUT_VARIABLE _prefix ERROR_VARIABLE _err RESULT_VARIABLE _rc
      OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(NOT _rc EQUAL 0)
      message(FATAL_ERROR "libtorch not found: '${_python}' cannot import torch (${_err}). "
        "Run scripts/install-deps.sh, or pass -DRL_PYTHON / -DCMAKE_PREFIX_PATH.")
    endif()
    set(_dir "${_prefix}/Torch")
    message(STATUS "libtorch: from the torch package of ${_python}")
  endif()
  set(Torch_DIR "${_dir}" CACHE PATH "Folder holding TorchConfig.cmake" FORCE)
endif()

# The library folder next to the config (<prefix>/share/cmake/Torch -> <prefix>/lib).
get_filename_component(RL_TORCH_PREFIX "${Torch_DIR}/../../.." ABSOLUTE)
set(RL_TORCH_LIB_DIR "${RL_TORCH_PREFIX}/lib")
if(NOT EXISTS "${RL_TORCH_LIB_DIR}/libc10.so")
  message(FATAL_ERROR "libtorch at '${RL_TORCH_PREFIX}' has no lib/libc10.so (Torch_DIR=${Torch_DIR})")
endif()
# TorchConfig looks these up with find_library, whose system folders come
# before its PATHS hint: pin them to this libtorch.
set(TORCH_LIBRARY "${RL_TORCH_LIB_DIR}/libtorch.so" CACHE FILEPATH "" FORCE)
set(c10_LIBRARY "${RL_TORCH_LIB_DIR}/libc10.so" CACHE FILEPATH "" FORCE)
set(kineto_LIBRARY "kineto_LIBRARY-NOTFOUND" CACHE FILEPATH "" FORCE)
set(RL_TORCH_HAS_CUDA OFF)
if(EXISTS "${RL_TORCH_LIB_DIR}/libtorch_cuda.so")
  set(RL_TORCH_HAS_CUDA ON)
  set(C10_CUDA_LIBRARY "${RL_TORCH_LIB_DIR}/libc10_cuda.so" CACHE FILEPATH "" FORCE)
endif()

find_package(Torch CONFIG REQUIRED NO_DEFAULT_PATH PATHS "${Torch_DIR}")
set(RL_TORCH_VERSION "${Torch_VERSION}")
if(RL_TORCH_VERSION VERSION_LESS RL_TORCH_MIN_VERSION)
  message(FATAL_ERROR "libtorch ${RL_TORCH_VERSION} at '${RL_TORCH_PREFIX}' is too old: rl needs "
    ">= ${RL_TORCH_MIN_VERSION}. Run scripts/install-deps.sh for the pinned wheel, or point "
    "Torch_DIR / RL_PYTHON at a newer one.")
endif()
message(STATUS "libtorch ${RL_TORCH_VERSION} at ${RL_TORCH_PREFIX} (CUDA: ${RL_TORCH_HAS_CUDA})")

# Torch's imported targets are directory-scoped; make them visible everywhere.
get_property(_targets DIRECTORY PROPERTY IMPORTED_TARGETS)
foreach(t ${_targets})
  get_target_property(_global ${t} IMPORTED_GLOBAL)
  if(NOT _global)
    set_target_properties(${t} PROPERTIES IMPORTED_GLOBAL TRUE)
  endif()
endforeach()

# A wheel's CUDA libraries depend on the NVIDIA wheels (nvidia/*/lib) through
# $ORIGIN RPATHs the linker does not follow: name them for the link.
file(GLOB _nvidia_lib_dirs LIST_DIRECTORIES true "${RL_TORCH_PREFIX}/../nvidia/*/lib")
set(RL_TORCH_LINK_OPTIONS "")
foreach(d ${_nvidia_lib_dirs})
  get_filename_component(d "${d}" ABSOLUTE)
  list(APPEND RL_TORCH_LINK_OPTIONS "LINKER:-rpath-link,${d}")
endforeach()

# Installed binaries find libtorch where it was at build time (the wheel).
list(APPEND CMAKE_INSTALL_RPATH "${RL_TORCH_LIB_DIR}")

# Precompiled <ATen/ATen.h>. Parsing it is about 15 s of the 20-30 s that a
# file using libtorch takes to compile on a 2-core machine, and the build has
# some 85 such files, so the header is parsed once per group of targets with
# the same flags: rl_torch_pch(<target>) builds a PCH for a target,
# rl_torch_pch(<target> REUSE_FROM <lender>) borrows the lender's, and
# SKIP <sources> leaves out the files that do not use ATen. GCC refuses a PCH
# built with other options (-Winvalid-pch under -Werror stops the build);
# RL_PCH=OFF compiles without it, which also shows a missing #include that the
# PCH hides.
option(RL_PCH "Precompile <ATen/ATen.h> for the targets compiled against libtorch" ON)
function(rl_torch_pch target)
  cmake_parse_arguments(ARG "" "REUSE_FROM" "SKIP" ${ARGN})
  if(NOT RL_PCH)
    return()
  endif()
  if(ARG_REUSE_FROM)
    # At the end of the configuration, as the lender may be defined after this
    # target (EVAL puts the names in now; DEFER would read the variables then).
    cmake_language(EVAL CODE "cmake_language(DEFER DIRECTORY [[${PROJECT_SOURCE_DIR}]] CALL
      target_precompile_headers [[${target}]] REUSE_FROM [[${ARG_REUSE_FROM}]])")
  else()
    target_precompile_headers(${target} PRIVATE <ATen/ATen.h>)
  endif()
  if(ARG_SKIP)
    set_source_files_properties(${ARG_SKIP} TARGET_DIRECTORY ${target}
      PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
  endif()
endfunction()
