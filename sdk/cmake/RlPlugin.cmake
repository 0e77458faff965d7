# rl_add_plugin(<target> SOURCES <files...> [LANGUAGE C])
#
# Builds a plugin library the way the host expects it: a MODULE library that
# exports exactly one symbol (rl_plugin_entry), links with -z defs so a missing
# symbol fails at build time rather than at load time, and lands in the
# build's plugin folder. Works in-tree and, through find_package(rl), out of
# tree.
include_guard(GLOBAL)

set(_RL_PLUGIN_CMAKE_DIR ${CMAKE_CURRENT_LIST_DIR})

function(rl_add_plugin target)
  cmake_parse_arguments(ARG "" "OUTPUT_DIR" "SOURCES;LIBRARIES" ${ARGN})
  add_library(${target} MODULE ${ARG_SOURCES})
  set_target_properties(${target} PROPERTIES
    PREFIX ""
    C_VISIBILITY_PRESET hidden
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  if(TARGET rl::sdk)
    target_link_libraries(${target} PRIVATE rl::sdk)
  else()
    target_link_libraries(${target} PRIVATE rl_sdk)
  endif()
  if(TARGET rl_warnings)
    target_link_libraries(${target} PRIVATE rl_warnings)
  endif()
  if(ARG_LIBRARIES)
    target_link_libraries(${target} PRIVATE ${ARG_LIBRARIES})
  endif()
  set(version_script ${_RL_PLUGIN_CMAKE_DIR}/rl-plugin.version)
  target_link_options(${target} PRIVATE
    "LINKER:--version-script=${version_script}" "LINKER:-z,defs")
  set_property(TARGET ${target} APPEND PROPERTY LINK_DEPENDS ${version_script})
  if(ARG_OUTPUT_DIR)
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${ARG_OUTPUT_DIR})
  elseif(DEFINED RL_BUILD_PLUGIN_DIR)
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${RL_BUILD_PLUGIN_DIR})
    install(TARGETS ${target} LIBRARY DESTINATION ${RL_INSTALL_PLUGIN_DIR})
  endif()
  set_property(GLOBAL APPEND PROPERTY RL_PLUGIN_TARGETS ${target})
endfunction()
